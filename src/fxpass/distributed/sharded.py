"""The entry point: ``fxpass.shard(program, world_size)`` gives one program per rank.

The strategies compose over one plan and one mesh (``tp x ep x pp``,
:mod:`~fxpass.distributed.mesh`). The plan is made (or read) and checked once: the
program is cut into pipeline stages (:mod:`.stages`) and, per stage, the plan is followed
into what every rank applies (:func:`~.tensor_parallel.tensor_script`,
:func:`~.expert_parallel.expert_script`) — a plan that does not fit fails here, before any
rank is made. Each rank's program is then one :class:`~fxpass.Pipeline` run on its stage's
program — the strategies' passes (:data:`STRATEGIES`), then the plan's options
(``sequence_parallel``, ``fuse``) — so every rank gets a :class:`~fxpass.Report` and a
failed rewrite leaves the input untouched.

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from rich.console import Console, ConsoleOptions, RenderResult
from rich.table import Table
from torch import fx

from ..core.contract import FunctionPass
from ..core.pipeline import Pipeline
from ..core.ranges import compile_range
from ..core.report import Report
from ..targets.apply import apply
from ..targets.export import load, save
from .analysis import analyze, check_world_size, choose_mesh, graph_and_params
from .collectives import C10D, DEFAULT_GROUP
from .consistency import check_ranks
from .expert_parallel import ExpertScript, expert_parallel, expert_script
from .mesh import Mesh, MeshError
from .plan import OPTIONS, PlanError, ShardError, ShardPlan, plural
from .shard_options import option_passes, record, set_options, tokens_of
from .stages import PipelineStages, pipeline_stages
from .tensor_parallel import TensorScript, tensor_parallel, tensor_script

__all__ = [
    "MANIFEST",
    "STRATEGIES",
    "ShardedPrograms",
    "collective_counts",
    "init_groups",
    "load_rank",
    "load_stage",
    "resolve_mesh",
    "shard",
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


# ----- the strategies, as passes over one plan ------------------------------------------------
@dataclass
class Strategy:
    """A parallelism the plan can ask for: ``prepare(stage program, plan, experts, staged)``
    follows the plan once for a stage (None: nothing to do there), ``rewrite(prepared, rank,
    mesh, group)`` gives the pass each rank runs."""

    name: str
    prepare: Callable[..., Any]
    rewrite: Callable[..., Any]


def _prepare_tensor(program: Any, plan: ShardPlan, experts: ExpertScript, staged: bool) -> Any:
    if plan.mesh.stage_size == 1:
        return None
    gm, params = graph_and_params(program)
    return tensor_script(gm, params, plan, partial=experts.partial, stage=staged)


def _prepare_experts(program: Any, plan: ShardPlan, experts: ExpertScript, staged: bool) -> Any:
    return experts if experts.blocks else None


def _tensor_pass(script: TensorScript, rank: int, mesh: Mesh, group: str) -> Any:
    options = {"world_size": mesh.world_size, "rank": rank, "plan": script, "group": group}
    return FunctionPass(tensor_parallel, "tensor_parallel", options=options)


def _expert_pass(script: ExpertScript, rank: int, mesh: Mesh, group: str) -> Any:
    options = {"world_size": mesh.world_size, "rank": rank, "plan": script}
    return FunctionPass(expert_parallel, "expert_parallel", options=options)


#: The strategies, in the order their passes run on each rank. Pipeline parallelism is
#: the cut into stages before them (:mod:`.stages`); sequence parallelism and the
#: collective fusion are the plan's options, run after them.
STRATEGIES = [
    Strategy("tensor_parallel", _prepare_tensor, _tensor_pass),
    Strategy("expert_parallel", _prepare_experts, _expert_pass),
]


# ----- choosing the mesh and the plan ----------------------------------------------------------
def resolve_mesh(
    program: Any,
    world_size: int | None,
    mesh: Mesh | dict | str | None,
    tp: int | None,
    ep: int | None,
    pp: int | None,
    plan: ShardPlan | None,
) -> Mesh:
    """The mesh asked for (a mesh, dims, a world size, or the plan's), checked for
    agreement; a world size alone lets :func:`~.analysis.choose_mesh` pick."""
    try:
        if isinstance(mesh, str):
            mesh = Mesh.parse(mesh)
        elif isinstance(mesh, dict):
            mesh = Mesh.from_dict(mesh)
        if any(d is not None for d in (tp, ep, pp)):
            dims = Mesh(tp or 1, ep or 1, pp or 1)
            if mesh is not None and mesh != dims:
                raise ShardError(f"the mesh {mesh} and tp/ep/pp {dims} disagree")
            mesh = dims
    except MeshError as e:
        raise ShardError(str(e)) from None
    if world_size is not None:
        check_world_size(world_size)
    if mesh is not None and world_size is not None and mesh.world_size != world_size:
        raise ShardError(
            f"the mesh {mesh} has {plural(mesh.world_size, 'rank')}, not {world_size}; "
            "give one of them"
        )
    if plan is not None:
        wanted = mesh if mesh is not None else None
        if wanted is not None and plan.mesh != wanted:
            raise PlanError(
                f"the plan is for the mesh {plan.mesh} ({plural(plan.world_size, 'rank')}), "
                f"not {wanted} ({plural(wanted.world_size, 'rank')}); make a new plan or edit "
                "its mesh"
            )
        if wanted is None and world_size is not None and plan.world_size != world_size:
            raise PlanError(
                f"the plan was made for world size {plan.world_size} ({plan.mesh}), not "
                f"{world_size}; make a new plan or edit its mesh"
            )
        return plan.mesh
    if mesh is not None:
        return mesh
    if world_size is None:
        raise ShardError("give the number of ranks (world_size), a mesh, or tp/ep/pp")
    return choose_mesh(program, world_size)


def _as_plan(plan: Any) -> ShardPlan | None:
    if plan is None or isinstance(plan, ShardPlan):
        return plan
    if isinstance(plan, dict):
        return ShardPlan.from_dict(plan)
    if isinstance(plan, (str, Path)):
        return ShardPlan.load(plan)
    raise PlanError(f"plan must be a ShardPlan, a dict or a JSON file, not {type(plan).__name__}")


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
    the program or the mesh :class:`PlanError` (before any rank is made).
    """
    if isinstance(program, (str, Path)):
        program = load(program)
    the_plan = _as_plan(plan)
    the_mesh = resolve_mesh(program, world_size, mesh, tp, ep, pp, the_plan)
    unsharded = weight_bytes(program)
    if the_mesh.world_size == 1:
        the_plan = ShardPlan(the_mesh, [])
        if fuse:
            the_plan.options["fuse"] = True
        options = {**OPTIONS, "group": group}
        out = ShardedPrograms([program], the_plan, [None], unsharded, options)
        out.notes = _notes(out)
        return out
    if the_plan is None:
        the_plan = analyze(program, mesh=the_mesh, uneven=uneven)
    set_options(the_plan, sequence_parallel, fuse, bucket, async_tp, gates)
    stages = _stages(program, the_plan)
    prepared = [_prepare(p, the_plan, stages is not None) for p in stages or [program]]
    if the_mesh.pp == 1 and not the_plan.sharded and not the_plan.experts:
        raise ShardError(
            f"found no parallel structure to split across {plural(the_mesh.world_size, 'rank')}"
            f": no linear, embedding or expert weight can be cut ({len(the_plan)} looked at); "
            "nothing to shard"
        )
    programs, reports = [], []
    for rank in range(the_mesh.world_size):
        place = the_mesh.place(rank)
        base = stages[place.stage] if stages is not None else program
        named = group if the_mesh.pp == 1 else place.group
        passes = [
            s.rewrite(prepared[place.stage][s.name], rank, the_mesh, named)
            for s in STRATEGIES
            if prepared[place.stage][s.name] is not None
        ] + option_passes(the_plan, place)
        if not passes:
            programs.append(base)
            reports.append(None)
            continue
        target = copy.deepcopy(base) if isinstance(base, fx.GraphModule) else base
        watch = list(instrument(rank)) if instrument is not None else []
        tokens = tokens_of(base)  # the size the plan's gates are read against
        with compile_range(tokens=tokens) if tokens else contextlib.nullcontext():
            result = apply(target, Pipeline(passes, name=f"shard rank {rank}"), instrument=watch)
        programs.append(result.program)
        reports.append(result.report)
    the_plan.applied = record(the_plan, reports)
    options = {**the_plan.options, "group": group}
    out = ShardedPrograms(programs, the_plan, reports, unsharded, options, stages)
    out.notes = _notes(out)
    return out


def _stages(program: Any, plan: ShardPlan) -> PipelineStages | None:
    if plan.mesh.pp == 1:
        return None
    if not isinstance(program, torch.export.ExportedProgram):
        raise ShardError("pipeline stages are cut from an ExportedProgram, not a GraphModule")
    stages = pipeline_stages(program, plan.mesh.pp, plan=plan.stages or None)
    plan.stages = stages.stages
    return stages


def _prepare(program: Any, plan: ShardPlan, staged: bool) -> dict[str, Any]:
    """Follow the plan once for one stage's program: what each strategy's pass applies."""
    gm, params = graph_and_params(program)
    experts = expert_script(gm, params, plan, stage=staged)
    return {s.name: s.prepare(program, plan, experts, staged) for s in STRATEGIES}


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
