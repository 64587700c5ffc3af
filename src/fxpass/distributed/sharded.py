"""The entry point: ``fxpass.shard(program, world_size)`` gives one program per rank.

The strategies (:func:`~.strategy.strategies`, one table) compose over one plan and one
mesh (``tp x ep x pp``, :mod:`~fxpass.distributed.mesh`). The plan is made (or read) once
by :func:`~.planning.plan_shards` — the mesh resolved, the program cut into pipeline
stages — and, per stage, followed into what every rank applies (each strategy's
``prepare``, :class:`Prepared`) — a plan that does not fit fails here, before any rank is made. Each rank's
program is then one :class:`~fxpass.Pipeline` run on its stage's program — the strategies'
rewrites, then the plan's options (:mod:`.shard_options`) — so every rank gets a
:class:`~fxpass.Report` and a failed rewrite leaves the input untouched.

:class:`ShardedPrograms` holds the programs, the plan and the memory each rank keeps;
:meth:`ShardedPrograms.save` writes ``rank0.pt2`` ... and a ``manifest.json``;
:func:`load_rank` reads back the file of the calling rank (under ``torchrun``:
``dist.get_rank()``), checking its checksum, and creates the mesh's process groups.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import io
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from rich.console import Console, ConsoleOptions, RenderResult
from rich.table import Table
from torch import fx

from ..core.pipeline import Pipeline
from ..core.ranges import compile_range
from ..core.report import Report
from ..targets.apply import apply
from ..targets.export import load, save
from .collectives import C10D, DEFAULT_GROUP
from .consistency import check_ranks
from .mesh import Mesh
from .plan import OPTIONS, ShardError, ShardPlan, plural
from .planning import Planned, plan_shards
from .shard_options import option_passes, record, tokens_of
from .stages import PipelineStages
from .strategy import Survey, strategies, strategy

__all__ = [
    "MANIFEST",
    "ShardedPrograms",
    "collective_counts",
    "init_groups",
    "load_rank",
    "load_stage",
    "shard",
    "shard_planned",
    "weight_bytes",
]

MANIFEST = "manifest.json"
_MANIFEST_FORMAT = "fxpass.sharded/2"
_READS = ("fxpass.sharded/1", _MANIFEST_FORMAT)


def weight_bytes(program: Any) -> int:
    """Bytes of the tensors a program keeps: parameters, buffers and constants, counted by
    storage (a slice that keeps its whole tensor's storage counts as the whole tensor; tied
    weights count once)."""
    if isinstance(program, torch.export.ExportedProgram):
        tensors = [*program.state_dict.values(), *program.constants.values()]
    else:
        tensors = [*program.parameters(), *program.buffers()]
    seen, total = set(), 0
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            continue
        storage = t.untyped_storage()
        key = storage.data_ptr() or id(storage)
        if key not in seen:
            seen.add(key)
            total += storage.nbytes()
    return total


_KINDS = {
    C10D.all_reduce.default: "all_reduce",
    C10D.all_gather_into_tensor.default: "all_gather",
    C10D.reduce_scatter_tensor.default: "reduce_scatter",
    C10D.all_to_all_single.default: "all_to_all",
    torch.ops.fxpass.all_reduce_add_rmsnorm.default: "all_reduce (fused)",
}


def collective_counts(program: Any) -> dict[str, int]:
    """How many collectives of each kind a rank's program issues per forward."""
    gm = program.graph_module if isinstance(program, torch.export.ExportedProgram) else program
    counts: dict[str, int] = {}
    for node in gm.graph.nodes:
        kind = _KINDS.get(node.target) if node.op == "call_function" else None
        if kind is not None:
            counts[kind] = counts.get(kind, 0) + 1
    return counts


@dataclass
class ShardedPrograms(Sequence):
    """One program per rank (index it by rank), the plan, the reports, and the memory."""

    programs: list[Any]
    plan: ShardPlan
    reports: list[Report | None]
    unsharded_bytes: int
    options: dict[str, Any]
    stages: PipelineStages | None = None
    notes: list[str] = field(default_factory=list)

    def __getitem__(self, rank: int) -> Any:  # type: ignore[override]
        return self.programs[rank]

    def __len__(self) -> int:
        return len(self.programs)

    @property
    def world_size(self) -> int:
        return len(self.programs)

    @property
    def mesh(self) -> Mesh:
        return self.plan.mesh

    def rank_bytes(self, rank: int) -> int:
        """Bytes of the weights ``rank`` keeps (parameters, buffers, constants)."""
        return weight_bytes(self.programs[rank])

    def check(self) -> list[Any]:
        """The rank consistency faults of the programs (:func:`~.consistency.check_ranks`):
        empty when every rank issues the same collectives in the same order."""
        return check_ranks(self.programs, self.mesh)

    def communication(self) -> Any:
        """Each rank's collectives and bytes per layer against the strategy's minimum
        (:func:`~.accounting.communication`)."""
        from .accounting import communication

        return communication(self)

    def table(self) -> Table:
        mesh = self.mesh
        title = plural(self.world_size, "rank")
        if mesh.ep > 1 or mesh.pp > 1:
            title += f", mesh {mesh}"
        table = Table(title=title, title_justify="left")
        cols = ["rank", *(["stage"] if mesh.pp > 1 else []), "weights (bytes)", "of unsharded",
                "collectives"]  # fmt: skip
        for col in cols:
            table.add_column(col, justify="left" if col == "collectives" else "right")
        for rank in range(self.world_size):
            nbytes = self.rank_bytes(rank)
            share = nbytes / self.unsharded_bytes if self.unsharded_bytes else 1.0
            counts = collective_counts(self.programs[rank])
            what = ", ".join(f"{n} {k}" for k, n in counts.items()) or "none"
            stage = [str(mesh.stage(rank))] if mesh.pp > 1 else []
            table.add_row(str(rank), *stage, f"{nbytes:,}", f"{share:.1%}", what)
        table.caption = f"unsharded program: {self.unsharded_bytes:,} bytes of weights"
        for note in self.notes:
            table.caption += f"\n{note}"
        table.caption_justify = "left"
        return table

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.table()

    def __str__(self) -> str:
        buf = io.StringIO()
        Console(file=buf, width=120, color_system=None, force_terminal=False).print(self)
        return buf.getvalue().rstrip()

    def pipeline_stage(self, rank: int, device: Any = "cpu") -> Any:
        """The ``torch.distributed.pipelining.PipelineStage`` of ``rank`` (call after
        :func:`init_groups`), running its program on its pipeline group."""
        return _pipeline_stage(self.mesh, rank, self.programs[rank], device)

    def save(self, directory: str | Path) -> Path:
        """Write ``rank<r>.pt2`` for every rank and ``manifest.json`` (mesh, plan, options,
        and per file its stage, bytes, weight bytes and sha256); returns the manifest."""
        if not all(isinstance(p, torch.export.ExportedProgram) for p in self.programs):
            raise ShardError(
                "save writes .pt2 files, which hold exported programs: shard the "
                "ExportedProgram (torch.export.export) rather than a GraphModule"
            )
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        files = []
        for rank, program in enumerate(self.programs):
            path = save(program, directory / f"rank{rank}.pt2")
            data = path.read_bytes()
            files.append(
                {
                    "rank": rank,
                    "stage": self.mesh.stage(rank),
                    "file": path.name,
                    "bytes": len(data),
                    "weight_bytes": self.rank_bytes(rank),
                    "sha256": hashlib.sha256(data).hexdigest(),
                }
            )
        manifest = {
            "format": _MANIFEST_FORMAT,
            "world_size": self.world_size,
            "mesh": self.mesh.to_dict(),
            "groups": [{"name": n, "ranks": r} for n, r in self.mesh.groups()],
            "unsharded_weight_bytes": self.unsharded_bytes,
            "options": self.options,
            "files": files,
            "plan": self.plan.to_dict(),
        }
        path = directory / MANIFEST
        path.write_text(json.dumps(manifest, indent=2) + "\n")
        return path


class Prepared(Mapping):
    """The scripts of one stage's program, each prepared on first use (a strategy may read
    another's: tensor parallelism reads which values hold the experts' partial sums)."""

    def __init__(self, survey: Survey, plan: Any) -> None:
        self.survey, self.plan = survey, plan
        self._done: dict[str, Any] = {}
        self._busy: set[str] = set()

    def __getitem__(self, name: str) -> Any:
        if name not in self._done:
            s = strategy(name)
            if name in self._busy:
                raise RuntimeError(f"the strategies' preparations read each other: {name}")
            self._busy.add(name)
            try:
                self._done[name] = s.prepare(self.survey, self.plan, self)
            finally:
                self._busy.discard(name)
        return self._done[name]

    def __iter__(self):
        return (s.name for s in strategies())

    def __len__(self) -> int:
        return len(strategies())


# ----- the ranks' programs, from the plan ------------------------------------------------------
def shard(
    program: torch.export.ExportedProgram | fx.GraphModule | str | Path,
    world_size: int | None = None,
    *,
    mesh: Mesh | dict | str | None = None,
    tp: int | None = None,
    ep: int | None = None,
    pp: int | None = None,
    plan: ShardPlan | dict | str | Path | None = None,
    sequence_parallel: bool | None = None,
    fuse: bool | None = None,
    bucket: int | bool | None = None,
    async_tp: int | None = None,
    gates: dict[str, Any] | None = None,
    group: str = DEFAULT_GROUP,
    uneven: str = "error",
    instrument: Callable[[int], Sequence[Any]] | None = None,
) -> ShardedPrograms:
    """Shard a captured program: one program per rank of a ``tp x ep x pp`` mesh.

    ``program`` is an ExportedProgram, a ``.pt2`` path, or a GraphModule (copied per rank;
    tensor parallelism only). Give ``world_size`` (the mesh is chosen: tensor parallelism,
    and the experts of a mixture of experts split across the ranks), or the mesh —
    ``mesh=Mesh(tp=2, pp=2)``, ``"tp=2,pp=2"``, or ``tp=``, ``ep=``, ``pp=`` — or a ``plan``
    (a :class:`ShardPlan`, its JSON as a dict or a file; default: analyze the program,
    ``uneven`` as in :func:`~fxpass.distributed.analyze`). ``sequence_parallel`` turns the
    all-reduces into reduce-scatters and all-gathers; ``fuse`` fuses each all-reduce with the
    residual add and RMSNorm after it (default: the plan's options). Collectives run on the
    process group named ``group`` (``"0"``: the default group; with pipeline stages, the
    groups :func:`init_groups` creates). ``instrument(rank)`` gives the instrumentation of
    rank ``rank``'s run (an :class:`~fxpass.html.HtmlReport` per rank draws the
    collectives each strategy inserted, with their provenance).

    A world size of 1 returns the program unchanged (``[program]``, an empty plan); a
    program with nothing to split raises :class:`ShardError`, and a plan that does not fit
    the program or the mesh :class:`PlanError` (before any rank is made). It is
    :func:`~.planning.plan_shards` followed by :func:`shard_planned`.
    """
    if isinstance(program, (str, Path)):
        program = load(program)
    planned = plan_shards(program, world_size, mesh=mesh, tp=tp, ep=ep, pp=pp, plan=plan,
                          sequence_parallel=sequence_parallel, fuse=fuse, bucket=bucket,
                          async_tp=async_tp, gates=gates, uneven=uneven)  # fmt: skip
    return shard_planned(planned, group=group, instrument=instrument)


def shard_planned(
    planned: Planned,
    *,
    group: str = DEFAULT_GROUP,
    instrument: Callable[[int], Sequence[Any]] | None = None,
) -> ShardedPrograms:
    """One program per rank from a plan made by :func:`~.planning.plan_shards`: the plan
    followed once per stage by every strategy (:class:`Prepared`; a plan that
    does not fit fails here, before any rank is made), then each rank's strategies'
    rewrites and the plan's options run as one :class:`~fxpass.Pipeline` on its stage's
    program (``group`` and ``instrument`` as for :func:`shard`)."""
    program, the_plan, the_mesh = planned.program, planned.plan, planned.mesh
    unsharded = weight_bytes(program)
    if the_mesh.world_size == 1:
        options = {**OPTIONS, "group": group}
        out = ShardedPrograms([program], the_plan, [None], unsharded, options)
        out.notes = _notes(out)
        return out
    staged = planned.stages is not None
    scripts = []
    for stage_program in planned.programs():
        prepared = Prepared(Survey.of(stage_program, the_mesh, staged=staged), the_plan)
        scripts.append({s.name: prepared[s.name] for s in strategies()})
    if not any(getattr(e, "sharded", True) for v in the_plan.sections.values() for e in v):
        raise ShardError(
            f"found no parallel structure to split across {plural(the_mesh.world_size, 'rank')}"
            f": no linear, embedding or expert weight can be cut ({len(the_plan)} looked at); "
            "nothing to shard"
        )
    named = group if group != DEFAULT_GROUP and the_mesh.pp == 1 else None
    programs, reports = [], []
    for rank in range(the_mesh.world_size):
        place = the_mesh.place(rank, named)
        base = planned.programs()[place.stage]
        mine = scripts[place.stage]
        passes = [s.rewrite(mine[s.name], place) for s in strategies() if mine[s.name] is not None]
        passes += option_passes(the_plan, place)
        if not passes:
            programs.append(base)
            reports.append(None)
            continue
        target = base  # an ExportedProgram is copied by apply; a GraphModule is edited in place
        if isinstance(base, fx.GraphModule):
            target = copy.deepcopy(base)
        watch = list(instrument(rank)) if instrument is not None else []
        tokens = tokens_of(base)  # the size the plan's gates are read against
        with compile_range(tokens=tokens) if tokens else contextlib.nullcontext():
            result = apply(target, Pipeline(passes, name=f"shard rank {rank}"), instrument=watch)
        programs.append(result.program)
        reports.append(result.report)
    the_plan.applied = record(the_plan, reports)
    options = {**the_plan.options, "group": group}
    out = ShardedPrograms(programs, the_plan, reports, unsharded, options, planned.stages)
    out.notes = _notes(out)
    return out


def _notes(shards: ShardedPrograms) -> list[str]:
    notes = []
    if shards.plan.options.get("fuse"):
        fused = sum(
            r.stats().get("fuse_allreduce_add_rmsnorm.rewrites", 0)
            for r in shards.reports
            if r is not None
        )
        if not fused and shards.plan.mesh.stage_size == 1:
            notes.append("--fuse fused no site: one rank per stage has no all-reduce to fuse")
        elif not fused:
            notes.append(
                "--fuse fused no site: no sum all-reduce feeds a residual add whose sum is "
                "RMS-normalized (the norms of this program come before their adds, or the "
                "all-reduces were turned into reduce-scatters)"
            )
    return notes


# ----- running the ranks ------------------------------------------------------------------------
def init_groups(mesh: Mesh | dict) -> dict[str, Any]:
    """Create the mesh's process groups on this rank (every rank must call it, right after
    ``init_process_group``), checking torch names them as the programs expect; returns
    them by name. A mesh of one stage needs none."""
    import torch.distributed as dist

    mesh = Mesh.from_dict(mesh) if isinstance(mesh, dict) else mesh
    made: dict[str, Any] = {}
    for name, ranks in mesh.groups():
        if name in _GROUPS:
            made[name] = _GROUPS[name]
            continue
        group = dist.new_group(ranks)
        got = group.group_name if isinstance(group, dist.ProcessGroup) else name
        if isinstance(group, dist.ProcessGroup) and got != name:
            raise ShardError(
                f"torch named the process group of ranks {ranks} {got!r}, but the sharded "
                f"programs use {name!r}: call init_groups right after init_process_group, "
                "before creating other groups"
            )
        made[name] = _GROUPS[name] = group
    return made


_GROUPS: dict[str, Any] = {}  # made by init_groups in this process


def _pipeline_stage(mesh: Mesh, rank: int, program: Any, device: Any) -> Any:
    from torch.distributed.pipelining import PipelineStage

    group = None
    if mesh.stage_size > 1:
        name = mesh.pipe_group_name(mesh.local(rank))
        if name not in _GROUPS:
            raise ShardError("call fxpass.distributed.init_groups(mesh) on every rank first")
        group = _GROUPS[name]
    return PipelineStage(program.module(), mesh.stage(rank), mesh.pp, torch.device(device),
                         group=group)  # fmt: skip


def load_rank(directory: str | Path, rank: int | None = None) -> torch.export.ExportedProgram:
    """Load the program of ``rank`` (default: this process's rank in torch.distributed)
    from a directory written by :meth:`ShardedPrograms.save` or ``fxpass shard``,
    checking the world size and the file's checksum against the manifest."""
    directory = Path(directory)
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ShardError(f"cannot read {directory / MANIFEST}: {e}") from None
    if manifest.get("format") not in _READS:
        raise ShardError(f"{directory / MANIFEST} is not a manifest written by fxpass shard")
    world_size = manifest["world_size"]
    if rank is None:
        import torch.distributed as dist

        if not dist.is_initialized():
            raise ShardError("load_rank needs a rank: pass it, or initialize torch.distributed")
        rank = dist.get_rank()
        if dist.get_world_size() != world_size:
            raise ShardError(
                f"the programs in {directory} are for {plural(world_size, 'rank')}, but this "
                f"process group has {dist.get_world_size()}"
            )
    entry = next((f for f in manifest["files"] if f["rank"] == rank), None)
    if entry is None:
        raise ShardError(f"{directory} has no program for rank {rank} (world size {world_size})")
    path = directory / entry["file"]
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != entry["sha256"]:
        raise ShardError(f"{path} does not match its checksum in the manifest (damaged or edited)")
    program = load(path)
    mesh = Mesh.from_dict(manifest["mesh"]) if "mesh" in manifest else Mesh(tp=world_size)
    if mesh.groups() and _initialized():
        init_groups(mesh)  # the stages' collectives run on their own groups
    return program


def _initialized() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def load_stage(directory: str | Path, device: Any = "cpu") -> Any:
    """This rank's ``torch.distributed.pipelining.PipelineStage``, from a directory written
    by ``fxpass shard`` with pipeline stages (``pp > 1``): its program loaded and checked
    (:func:`load_rank`), the mesh's groups created. Drive it with a schedule::

        stage = fxpass.distributed.load_stage("tp2pp2")
        schedule = ScheduleGPipe(stage, n_microbatches=4)
        out = schedule.step(x) if stage.is_first else schedule.step()
    """
    import torch.distributed as dist

    if not _initialized():
        raise ShardError("load_stage runs on a rank: initialize torch.distributed first")
    manifest = json.loads((Path(directory) / MANIFEST).read_text())
    mesh = Mesh.from_dict(manifest["mesh"])
    if mesh.pp == 1:
        raise ShardError(f"the programs in {directory} have no pipeline stages (mesh {mesh})")
    program = load_rank(directory)
    return _pipeline_stage(mesh, dist.get_rank(), program, device)
