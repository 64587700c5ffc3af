"""The entry point: ``fxpass.shard(program, world_size)`` gives one program per rank.

Each rank's program is made by one :class:`~fxpass.Pipeline` run on the captured program —
``tensor_parallel`` (the plan, this rank), then optionally ``sequence_parallel`` and
``fuse_allreduce_add_rmsnorm`` — so every rank gets a :class:`~fxpass.Report` and a failed
rewrite leaves the input untouched. :class:`ShardedPrograms` holds the programs, the plan
and the memory each rank keeps; :meth:`ShardedPrograms.save` writes ``rank0.pt2`` ... and
a ``manifest.json``; :func:`load_rank` reads back the file of the calling rank (under
``torchrun``: ``dist.get_rank()``), checking its checksum.
"""

from __future__ import annotations

import copy
import hashlib
import io
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from rich.console import Console, ConsoleOptions, RenderResult
from rich.table import Table
from torch import fx

from ..core.contract import FunctionPass
from ..core.pipeline import Pipeline
from ..core.registry import REGISTRY
from ..core.report import Report
from ..targets.apply import apply
from ..targets.export import load, save
from .analysis import analyze, check_world_size, graph_and_params
from .collectives import DEFAULT_GROUP
from .plan import PlanError, ShardError, ShardPlan
from .rewrite import plan_flow, tensor_parallel
from .sequence_parallel import sequence_parallel as _sequence_parallel

__all__ = ["MANIFEST", "ShardedPrograms", "load_rank", "shard", "weight_bytes"]

MANIFEST = "manifest.json"
_MANIFEST_FORMAT = "fxpass.sharded/1"


def weight_bytes(program: Any) -> int:
    """Bytes of the tensors a program keeps: parameters, buffers and constants (each
    storage counted once, so tied weights count once)."""
    if isinstance(program, torch.export.ExportedProgram):
        tensors = [*program.state_dict.values(), *program.constants.values()]
    else:
        tensors = [*program.parameters(), *program.buffers()]
    seen, total = set(), 0
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            continue
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), t.numel())
        if key not in seen:
            seen.add(key)
            total += t.numel() * t.element_size()
    return total


@dataclass
class ShardedPrograms(Sequence):
    """One program per rank (index it by rank), the plan, the reports, and the memory."""

    programs: list[Any]
    plan: ShardPlan
    reports: list[Report | None]
    unsharded_bytes: int
    options: dict[str, Any]

    def __getitem__(self, rank: int) -> Any:  # type: ignore[override]
        return self.programs[rank]

    def __len__(self) -> int:
        return len(self.programs)

    @property
    def world_size(self) -> int:
        return len(self.programs)

    def rank_bytes(self, rank: int) -> int:
        """Bytes of the weights ``rank`` keeps (parameters, buffers, constants)."""
        return weight_bytes(self.programs[rank])

    def table(self) -> Table:
        table = Table(title=f"{self.world_size} ranks", title_justify="left")
        for col in ("rank", "weights (bytes)", "of unsharded", "collectives"):
            table.add_column(col, justify="right")
        collectives = len(self.plan.collectives)
        for rank in range(self.world_size):
            nbytes = self.rank_bytes(rank)
            share = nbytes / self.unsharded_bytes if self.unsharded_bytes else 1.0
            table.add_row(str(rank), f"{nbytes:,}", f"{share:.1%}", str(collectives))
        table.caption = f"unsharded program: {self.unsharded_bytes:,} bytes of weights"
        table.caption_justify = "left"
        return table

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.table()

    def __str__(self) -> str:
        buf = io.StringIO()
        Console(file=buf, width=120, color_system=None, force_terminal=False).print(self)
        return buf.getvalue().rstrip()

    def save(self, directory: str | Path) -> Path:
        """Write ``rank<r>.pt2`` for every rank and ``manifest.json`` (world size, plan,
        options, and per file its bytes, weight bytes and sha256); returns the manifest."""
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
                    "file": path.name,
                    "bytes": len(data),
                    "weight_bytes": self.rank_bytes(rank),
                    "sha256": hashlib.sha256(data).hexdigest(),
                }
            )
        manifest = {
            "format": _MANIFEST_FORMAT,
            "world_size": self.world_size,
            "unsharded_weight_bytes": self.unsharded_bytes,
            "options": self.options,
            "files": files,
            "plan": self.plan.to_dict(),
        }
        path = directory / MANIFEST
        path.write_text(json.dumps(manifest, indent=2) + "\n")
        return path


def _as_plan(plan: Any, program: Any, world_size: int, uneven: str) -> ShardPlan:
    if plan is None:
        return analyze(program, world_size, uneven=uneven)
    if isinstance(plan, ShardPlan):
        return plan
    if isinstance(plan, dict):
        return ShardPlan.from_dict(plan)
    if isinstance(plan, (str, Path)):
        return ShardPlan.load(plan)
    raise PlanError(f"plan must be a ShardPlan, a dict or a JSON file, not {type(plan).__name__}")


def _pipeline(plan: ShardPlan, rank: int, n: int, group: str, sp: bool, fuse: bool) -> Pipeline:
    options = {"world_size": n, "rank": rank, "plan": plan, "group": group}
    passes: list[Any] = [FunctionPass(tensor_parallel, "tensor_parallel", options=options)]
    if sp:
        options = {"world_size": n, "rank": rank}
        passes.append(FunctionPass(_sequence_parallel, "sequence_parallel", options=options))
    if fuse:  # export's asserts and no-op casts sit between a residual add and its norm
        for name in ("remove_assert_ops", "remove_noop", "fuse_allreduce_add_rmsnorm"):
            passes.append(REGISTRY.create(name))
    return Pipeline(passes, name=f"shard rank {rank}")


def shard(
    program: torch.export.ExportedProgram | fx.GraphModule | str | Path,
    world_size: int,
    *,
    plan: ShardPlan | dict | str | Path | None = None,
    sequence_parallel: bool = False,
    fuse: bool = False,
    group: str = DEFAULT_GROUP,
    uneven: str = "error",
) -> ShardedPrograms:
    """Shard a captured program for tensor parallelism: one program per rank.

    ``program`` is an ExportedProgram, a ``.pt2`` path, or a GraphModule (copied per rank).
    ``plan`` is a :class:`ShardPlan` (or its JSON, as a dict or a file); by default the
    program is analyzed (:func:`~fxpass.distributed.analyze`; ``uneven`` as there).
    ``sequence_parallel`` turns the all-reduces into reduce-scatters and all-gathers;
    ``fuse`` fuses each all-reduce with the residual add and RMSNorm after it. The
    collectives run on the process group named ``group`` (``"0"``: the default group).

    A world size of 1 returns the program unchanged (``[program]``, an empty plan); a
    program with nothing to split raises :class:`ShardError`, and a plan that does not fit
    the program :class:`PlanError` (before any rank is made).
    """
    world_size = check_world_size(world_size)
    if isinstance(program, (str, Path)):
        program = load(program)
    options = {"sequence_parallel": sequence_parallel, "fuse": fuse, "group": group}
    unsharded = weight_bytes(program)
    if world_size == 1:
        return ShardedPrograms([program], ShardPlan(1, []), [None], unsharded, options)
    the_plan = _as_plan(plan, program, world_size, uneven)
    plan_flow(*graph_and_params(program), the_plan, world_size)  # a plan that does not fit
    if not the_plan.sharded:
        raise ShardError(
            f"found no parallel structure to split across {world_size} ranks: no linear or "
            f"embedding weight can be cut ({len(the_plan)} looked at); nothing to shard"
        )
    programs, reports = [], []
    for rank in range(world_size):
        pipe = _pipeline(the_plan, rank, world_size, group, sequence_parallel, fuse)
        target = copy.deepcopy(program) if isinstance(program, fx.GraphModule) else program
        result = apply(target, pipe)
        programs.append(result.program)
        reports.append(result.report)
    return ShardedPrograms(programs, the_plan, reports, unsharded, options)


def load_rank(directory: str | Path, rank: int | None = None) -> torch.export.ExportedProgram:
    """Load the program of ``rank`` (default: this process's rank in torch.distributed)
    from a directory written by :meth:`ShardedPrograms.save` or ``fxpass shard``,
    checking the world size and the file's checksum against the manifest."""
    directory = Path(directory)
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ShardError(f"cannot read {directory / MANIFEST}: {e}") from None
    if manifest.get("format") != _MANIFEST_FORMAT:
        raise ShardError(f"{directory / MANIFEST} is not a manifest written by fxpass shard")
    world_size = manifest["world_size"]
    if rank is None:
        import torch.distributed as dist

        if not dist.is_initialized():
            raise ShardError("load_rank needs a rank: pass it, or initialize torch.distributed")
        rank = dist.get_rank()
        if dist.get_world_size() != world_size:
            raise ShardError(
                f"the programs in {directory} are for {world_size} ranks, but this process "
                f"group has {dist.get_world_size()}"
            )
    entry = next((f for f in manifest["files"] if f["rank"] == rank), None)
    if entry is None:
        raise ShardError(f"{directory} has no program for rank {rank} (world size {world_size})")
    path = directory / entry["file"]
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != entry["sha256"]:
        raise ShardError(f"{path} does not match its checksum in the manifest (damaged or edited)")
    return load(path)
