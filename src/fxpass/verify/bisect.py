"""Bisection: find the first pass, and within it the first single rewrite, that breaks numerics.

Every rewrite made through the rewrite engine (or by any pass that asks
:meth:`PassContext.allow <fxpass.PassContext.allow>` before each change) is counted. A run
with ``debug_counter=DebugCounter(count=k)`` makes only the first ``k`` of them, exactly as
MLIR's debug counters do, so the first bad rewrite is found by binary search over ``k`` on
fresh copies of the program:

1. one full run, checking numerics after every pass: the first pass whose outputs diverge,
   and how many rewrites the run makes (``N``);
2. runs with ``count=k``: ``k = 0`` must match the original and ``k = N`` does not; halve the
   interval until ``k - 1`` matches and ``k`` does not. Runs with ``k - 1`` and ``k`` rewrites
   are identical up to rewrite ``k``, so rewrite ``k`` is the one that breaks numerics.

>>> result = bisect(gm, "fuse_add_rmsnorm,cse", inputs)           # doctest: +SKIP
>>> print(result)                                                  # doctest: +SKIP
first bad pass: fuse_add_rmsnorm (output 0 at [0, 3, 17]: expected 1.25, got 1.75 ...)
first bad rewrite: #3 of 4, in pass fuse_add_rmsnorm, rule add_rmsnorm: replaced add_3, ...
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx

from ..core.context import ChangeEvent, DebugCounter, current_context
from ..core.errors import FxpassError
from ..core.instrument import Instrumentation
from ..core.spec import resolve_pipeline
from ..fxutil.messages import error_summary
from .compare import Comparison, run_graph_promoted
from .inputs import output_names, program_inputs, sample_args
from .numerics import NumericsCheck, PassNumerics, check_graph, run_graph

__all__ = ["BisectResult", "RewriteInfo", "bisect"]


@dataclass
class RewriteInfo:
    """One counted rewrite: its number in the run, the pass that made it, what it changed."""

    index: int
    pass_path: str
    total: int = 0
    pass_index: int = 0  # its number among the rewrites of that run of that pass
    rule: str = ""
    kind: str = ""
    old: list[str] = field(default_factory=list)
    new: list[str] = field(default_factory=list)
    location: str = ""

    def __str__(self) -> str:
        of = f" of {self.total}" if self.total else ""
        text = f"#{self.index}{of} in the run, #{self.pass_index} of pass {self.pass_path}"
        if self.rule:
            text += f", rule {self.rule}"
        if self.old or self.new:
            text += f": {self.kind or 'replace'} {', '.join(self.old) or '-'}"
            text += f" -> {', '.join(self.new) or '-'}"
        if self.location:
            text += f" ({self.location})"
        return text

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class BisectResult:
    """What :func:`bisect` found. ``ok`` is True when no pass breaks numerics."""

    ok: bool
    spec: str
    total_rewrites: int = 0
    first_bad_pass: PassNumerics | None = None
    final: Comparison | None = None
    rewrite: RewriteInfo | None = None
    rewrite_comparison: Comparison | None = None
    runs: int = 0
    note: str = ""

    def lines(self) -> list[str]:
        if self.ok:
            return [
                f"numerics hold after every pass of '{self.spec}' "
                f"({self.total_rewrites} counted rewrites, {self.runs} runs)"
            ]
        out = []
        if self.first_bad_pass is not None:
            cmp = self.first_bad_pass.comparison
            out.append(f"first bad pass: {self.first_bad_pass.name} ({cmp.summary()})")
        if self.rewrite is not None:
            out.append(f"first bad rewrite: {self.rewrite}")
            if self.rewrite_comparison is not None:
                out.append(f"  with it: {self.rewrite_comparison.summary()}")
        if self.note:
            out.append(self.note)
        out.append(f"({self.runs} runs)")
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "spec": self.spec,
            "total_rewrites": self.total_rewrites,
            "first_bad_pass": self.first_bad_pass.to_dict() if self.first_bad_pass else None,
            "final": self.final.to_dict() if self.final else None,
            "rewrite": self.rewrite.to_dict() if self.rewrite else None,
            "rewrite_comparison": (
                self.rewrite_comparison.to_dict() if self.rewrite_comparison else None
            ),
            "runs": self.runs,
            "note": self.note,
        }


class _Probe(DebugCounter):
    """A debug counter that also notes which pass asked for each action."""

    def __init__(self, count: int = -1) -> None:
        super().__init__(count=count)
        self.where: list[str] = []

    def allow(self) -> bool:
        ctx = current_context()
        self.where.append("/".join(ctx.pass_path) if ctx else "?")
        return super().allow()


class _Events(Instrumentation):
    """Keeps the change event with index ``k`` (the rewrite under suspicion)."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.event: ChangeEvent | None = None

    def on_change(self, event, ctx):
        if event.index == self.k and self.event is None:
            self.event = event


class _Subject:
    """The program under test: makes fresh copies, runs the pipeline, evaluates outputs."""

    def __init__(self, target: Any, sample_inputs: Sequence[Any] | None) -> None:
        self.target = target
        if isinstance(target, torch.export.ExportedProgram):
            args, kwargs = sample_args(target, sample_inputs)
            self.inputs = program_inputs(target, args, kwargs)
            self.names: list[str] | None = output_names(target)
            self.gm = target.graph_module
        elif isinstance(target, fx.GraphModule):
            self.gm = target
            self.inputs, _ = sample_args(target, sample_inputs)
            self.names = None
        else:
            raise TypeError(
                f"bisect takes a GraphModule or an ExportedProgram, not {type(target).__name__}"
            )
        try:
            self.reference = run_graph(self.gm, self.inputs)
            self.truth = run_graph_promoted(self.gm, self.inputs)
        except Exception as e:
            raise FxpassError(
                "cannot bisect: the input graph does not run on the sample inputs "
                f"({error_summary(e)})"
            ) from e

    def run(self, pipeline: Any, **kw: Any) -> fx.GraphModule:
        gm = copy.deepcopy(self.gm)
        return pipeline.run(gm, self.inputs, **kw).graph_module

    def compare(self, gm: fx.GraphModule, rtol, atol) -> Comparison:
        return check_graph(
            self.reference,
            gm,
            self.inputs,
            rtol=rtol,
            atol=atol,
            names=self.names,
            truth=self.truth,
        )


def bisect(
    target: fx.GraphModule | torch.export.ExportedProgram,
    pipeline: Any = None,
    sample_inputs: Sequence[Any] | None = None,
    *,
    rtol: float | None = None,
    atol: float | None = None,
    on_step: Callable[[str], None] | None = None,
) -> BisectResult:
    """Find the first pass, and the first single rewrite, after which numerics diverge.

    ``target`` is not modified (every run works on a fresh copy). ``pipeline`` is a
    :class:`~fxpass.Pipeline`, a spec string, a pass, a list of passes, or None (the
    registered ``default``), as :func:`fxpass.apply` takes.
    ``sample_inputs`` are the inputs of the GraphModule (for an ExportedProgram: its user
    inputs; default: its ``example_inputs``). ``on_step`` receives a line per run (progress).
    """
    pipe = resolve_pipeline(pipeline)
    subject = _Subject(target, sample_inputs)
    say = on_step or (lambda _msg: None)
    spec = str(pipe)

    check = NumericsCheck(
        subject.inputs,
        rtol=rtol,
        atol=atol,
        names=subject.names,
        reference=subject.reference,  # every run works on a copy of subject.gm
        truth=subject.truth,
    )
    probe = _Probe()
    say("full run, checking numerics after every pass")
    final_gm = subject.run(pipe, instrument=[check], debug_counter=probe)
    final = subject.compare(final_gm, rtol, atol)
    result = BisectResult(
        ok=check.ok and final.ok,
        spec=spec,
        total_rewrites=probe.seen,
        first_bad_pass=check.first_divergence,
        final=final,
        runs=1,
    )
    if result.ok:
        return result
    if final.ok:
        result.note = "the final outputs match again; only intermediate graphs diverge"
        return result
    n = probe.seen

    seen: dict[int, tuple[bool, Comparison, ChangeEvent | None]] = {}

    def fails(k: int) -> tuple[bool, Comparison, ChangeEvent | None]:
        if k in seen:
            return seen[k]
        events = _Events(k)
        say(f"run with the first {k} of {n} rewrites")
        gm = subject.run(pipe, instrument=[events], debug_counter=DebugCounter(count=k))
        result.runs += 1
        cmp = subject.compare(gm, rtol, atol)
        seen[k] = (not cmp.ok, cmp, events.event)
        return seen[k]

    bad, _, _ = fails(0)
    if n == 0 or bad:
        result.note = (
            "the divergence does not come from counted rewrites: the pass that breaks "
            "numerics does not ask ctx.allow() before its changes"
        )
        return result
    lo, hi = 0, n  # numerics hold with lo rewrites and break with hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fails(mid)[0]:
            hi = mid
        else:
            lo = mid
    _, cmp, event = fails(hi)
    where = probe.where[hi - 1]
    first = hi - 1
    while first > 0 and probe.where[first - 1] == where:
        first -= 1
    info = RewriteInfo(index=hi, pass_path=where, total=n, pass_index=hi - first)
    if event is not None:
        info.rule, info.kind, info.location = event.rule, event.kind, event.location
        info.old = [getattr(x, "name", str(x)) for x in event.old]
        info.new = [getattr(x, "name", str(x)) for x in event.new]
    result.rewrite, result.rewrite_comparison = info, cmp
    return result
