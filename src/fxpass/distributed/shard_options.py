"""The passes a plan's options ask for on the sharded graphs, each gated by size.

After the strategies' rewrites (:func:`~.strategy.strategies`), each rank runs the passes
its plan's ``options`` turn on, in this order (:data:`OPTION_PASSES`):

========================  ======================================  =========================
option                    pass                                    value
========================  ======================================  =========================
``sequence_parallel``     :mod:`.sequence_parallel`               true / false
``fuse``                  :mod:`.fuse_allreduce_add_rmsnorm`      true / false
``bucket``                :mod:`.bucket_collectives`              the threshold in bytes (0: off)
``async_tp``              :mod:`.async_tp`                        chunks per matmul (0: off)
========================  ======================================  =========================

Each pays off only at some sizes (vLLM gates the same passes by compile range), so each
may carry a *gate*, a range of token counts (``plan.gates = {"async_tp": [512, None]}``):
the rank's pipeline runs under :func:`fxpass.core.ranges.compile_range` for the program's
token count, and a gated pass outside its range is skipped, with the reason in the report.
No default gate has been measured (no GPU was lent to this work): by default every option
applies at every size, and the gates are there to be set from a measurement.

What ran is recorded in the plan (``plan.applied``): for each option asked for, whether
its pass changed the graphs and why — its statistics, the reason it skipped, or that it
found nothing to change.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..core.contract import FunctionPass
from ..core.pass_registry import REGISTRY, applies_to

__all__ = ["OPTION_PASSES", "OptionPass", "option_passes", "record", "tokens_of"]


@dataclass(frozen=True)
class OptionPass:
    """One option of the plan: the passes it adds to a rank's pipeline (``make(value,
    place)``), the pass whose record says what happened, and what it does."""

    option: str
    pass_name: str
    make: Callable[[Any, Any], list[Any]]
    what: str


def _sequence_parallel(value: Any, place: Any) -> list[Any]:
    from .sequence_parallel import sequence_parallel

    options = {"world_size": place.size, "rank": place.local}
    return [FunctionPass(sequence_parallel, "sequence_parallel", options=options)]


def _fuse(value: Any, place: Any) -> list[Any]:
    # export's asserts and no-op casts sit between a residual add and its norm
    return [REGISTRY.create(n) for n in ("remove_assert_ops", "remove_noop",
                                         "fuse_allreduce_add_rmsnorm")]  # fmt: skip


def _bucket(value: Any, place: Any) -> list[Any]:
    from .bucket_collectives import bucket_collectives

    options = {"threshold": int(value)}
    return [FunctionPass(bucket_collectives, "bucket_collectives", options=options)]


def _async_tp(value: Any, place: Any) -> list[Any]:
    from .async_tp import async_tp

    options = {"chunks": int(value)}
    return [FunctionPass(async_tp, "async_tp", options=options)]


#: The options, in the order their passes run (bucketing before async TP, which would
#: otherwise see its own chunks' collectives as a bucket).
OPTION_PASSES = [
    OptionPass("sequence_parallel", "sequence_parallel", _sequence_parallel,
               "all-reduces turned into reduce-scatter + all-gather over the tokens"),
    OptionPass("fuse", "fuse_allreduce_add_rmsnorm", _fuse,
               "all-reduce + residual add + RMSNorm fused into one op"),
    OptionPass("bucket", "bucket_collectives", _bucket,
               "adjacent small collectives of one group merged into one launch"),
    OptionPass("async_tp", "async_tp", _async_tp,
               "all-gather -> matmul and matmul -> reduce-scatter split into chunks that "
               "overlap communication with compute"),
]  # fmt: skip


def tokens_of(program: Any) -> int | None:
    """The program's token count (static shapes): its first user input's elements — token
    ids — or, for a pipeline stage that receives activations, their rows."""
    if not isinstance(program, torch.export.ExportedProgram):
        return None
    inputs = set(program.graph_signature.user_inputs)
    for node in program.graph_module.graph.nodes:
        val = node.meta.get("val") if node.op == "placeholder" else None
        if node.name in inputs and isinstance(val, torch.Tensor) and val.dim() >= 1:
            if val.is_floating_point():
                return int(val.numel() // max(1, val.shape[-1]))
            return int(val.numel())
    return None


def option_passes(plan: Any, place: Any) -> list[Any]:
    """The passes rank ``place`` runs for the plan's options, gated by ``plan.gates``."""
    if plan.mesh.stage_size == 1:
        return []
    passes: list[Any] = []
    for opt in OPTION_PASSES:
        value = plan.options.get(opt.option)
        if not value:
            continue
        made = opt.make(value, place)
        gate = plan.gates.get(opt.option)
        if gate is not None:
            lo, hi = gate
            made = [applies_to(p, tokens=(lo, hi)) for p in made]
        passes.extend(made)
    return passes


def record(plan: Any, reports: list[Any]) -> list[dict[str, Any]]:
    """For each option the plan asks for: whether its pass changed the graphs (on any rank)
    and why, from the ranks' reports."""
    out = []
    for opt in OPTION_PASSES:
        value = plan.options.get(opt.option)
        if not value:
            continue
        entry = {"option": opt.option, "pass": opt.pass_name, "value": value,
                 "applied": False, "why": ""}  # fmt: skip
        if plan.mesh.stage_size == 1:
            entry["why"] = "one rank per stage: no collective to change"
            out.append(entry)
            continue
        records = []
        for report in reports:
            if report is None:
                continue
            try:
                records.append(report.find(opt.pass_name))
            except KeyError:
                continue
        changed = [r for r in records if r.modified]
        if changed:
            stats = ", ".join(f"{k.split('.', 1)[-1].replace('_', ' ')} {v:g}"
                              for k, v in changed[0].stats.items())  # fmt: skip
            entry.update(applied=True, why=f"{opt.what} ({stats})" if stats else opt.what)
        elif any(r.status == "skipped" for r in records):
            skipped = next(r for r in records if r.status == "skipped")
            entry["why"] = "skipped: " + ("; ".join(skipped.notes) or "disabled")
        else:
            notes = [n for r in records for n in r.notes]
            entry["why"] = "found nothing to change" + (f": {notes[0]}" if notes else "")
        out.append(entry)
    return out
