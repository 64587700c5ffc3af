"""Numerics verification: does the transformed graph still compute what the original did?

Run the original and the transformed program on the same sample inputs (given, or generated
from the placeholders' ``meta['val']``) and compare every output with tolerances that depend
on its dtype. :func:`verify_numerics` compares two programs at the end; the
:class:`NumericsCheck` instrumentation compares after every pass that changed the graph and
names the first pass whose output diverges, with the largest error and where it is.

>>> check = NumericsCheck()                                   # doctest: +SKIP
>>> pipeline.run(gm, inputs, instrument=[check])              # doctest: +SKIP
>>> print(check.first_divergence)                             # doctest: +SKIP
pass 'fuse_add_rmsnorm' diverges: output 0 at [0, 3, 17]: expected 1.25, got 1.75 ...
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx
from torch.utils import _pytree as pytree

from ..core.errors import FxpassError
from ..core.instrument import Instrumentation
from ..fxutil.messages import error_summary
from .compare import (
    Comparison,
    Divergence,
    NumericsError,
    compare_outputs,
    run_graph_promoted,
)
from .inputs import sample_args, sample_inputs_from_meta

__all__ = [
    "NumericsCheck",
    "PassNumerics",
    "check_graph",
    "run_graph",
    "verify_numerics",
]


# ----- running --------------------------------------------------------------------------------
def run_graph(gm: fx.GraphModule, inputs: Sequence[Any]) -> list[Any]:
    """Run ``gm``'s graph (not its possibly stale code) on copies of ``inputs``; flat outputs."""
    args = [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]
    with torch.no_grad():
        out = fx.Interpreter(gm).run(*args)
    return pytree.tree_leaves(out)


def check_graph(
    reference: Sequence[Any],
    gm: fx.GraphModule,
    inputs: Sequence[Any],
    *,
    rtol: float | None = None,
    atol: float | None = None,
    names: Sequence[str] | None = None,
    truth: Sequence[Any] | None = None,
) -> Comparison:
    """Run ``gm`` and compare with ``reference``; a graph that fails to run does not match.

    ``truth`` is the original's float32 outputs (:func:`run_graph_promoted`), if known."""
    try:
        outputs = run_graph(gm, inputs)
    except Exception as e:  # broad: reported — a graph that does not run diverges, saying why
        failure = Divergence(
            -1, "the graph", expected="outputs", actual=error_summary(e), reason="run"
        )
        return Comparison(ok=False, outputs=len(reference), failures=[failure])
    return compare_outputs(reference, outputs, rtol=rtol, atol=atol, names=names, truth=truth)


def _callable(program: Any) -> Callable[..., Any]:
    if isinstance(program, torch.export.ExportedProgram):
        return program.module()
    if callable(program):
        return program
    raise TypeError(
        f"cannot run {type(program).__name__}: expected a GraphModule, an ExportedProgram, "
        "a torch.nn.Module or a function"
    )


def verify_numerics(
    original: Any,
    transformed: Any,
    sample_inputs: Sequence[Any] | None = None,
    *,
    rtol: float | None = None,
    atol: float | None = None,
) -> Comparison:
    """Run ``original`` and ``transformed`` on the same inputs and compare their outputs.

    Both may be GraphModules, ExportedPrograms, modules or functions. Without
    ``sample_inputs``, an ExportedProgram's ``example_inputs`` are used, else inputs are made
    from the placeholders' ``meta['val']`` (:func:`sample_inputs_from_meta`). Returns a
    :class:`Comparison` (truthy when the outputs match); ``.check()`` raises on a mismatch.
    """
    args, kwargs = _inputs_for(original, transformed, sample_inputs)
    outs = []
    for program in (original, transformed):
        fn = _callable(program)
        call_args = [x.clone() if isinstance(x, torch.Tensor) else x for x in args]
        with torch.no_grad():
            outs.append(fn(*call_args, **copy.copy(kwargs)))
    truth = None
    graph = original.module() if isinstance(original, torch.export.ExportedProgram) else original
    if isinstance(graph, fx.GraphModule) and not kwargs:
        truth = run_graph_promoted(graph, args)
    return compare_outputs(outs[0], outs[1], rtol=rtol, atol=atol, truth=truth)


def _inputs_for(original, transformed, sample_inputs) -> tuple[list[Any], dict[str, Any]]:
    if isinstance(sample_inputs, Mapping):
        return [], dict(sample_inputs)

    def stored(program: Any) -> bool:
        return getattr(program, "example_inputs", None) is not None and isinstance(
            program, torch.export.ExportedProgram
        )

    # either program's example_inputs come before inputs made from either one's meta['val']
    for program in sorted((original, transformed), key=lambda p: not stored(p)):
        picked = sample_args(program, sample_inputs)
        if picked is not None:
            return picked
    raise ValueError("no sample inputs given and none can be made: pass sample_inputs")


# ----- after each pass ------------------------------------------------------------------------
@dataclass
class PassNumerics:
    """The numerics after one run of one pass that changed the graph."""

    name: str
    spec: str
    run: int
    comparison: Comparison

    @property
    def ok(self) -> bool:
        return self.comparison.ok

    def __str__(self) -> str:
        label = self.spec or self.name
        if self.run > 1:
            label += f" (run {self.run})"
        if self.ok:
            return f"pass '{label}': {self.comparison.summary()}"
        return f"pass '{label}' diverges: {self.comparison.summary()}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "pass": self.name,
            "spec": self.spec,
            "run": self.run,
            "comparison": self.comparison.to_dict(),
        }


class NumericsCheck(Instrumentation):
    """Compare the graph's outputs with the original's after every pass that changed it.

    Inputs are, in order of preference: ``inputs`` given here (one per placeholder), the
    run's ``sample_inputs`` when there is one per placeholder, or inputs made from the
    placeholders' ``meta['val']``. With ``raise_on_divergence`` the first divergence fails
    the run (it rolls back); otherwise read :attr:`results` / :attr:`first_divergence`.
    ``names`` label the flat outputs (for an exported program: :func:`output_names`).

    A caller that has already run the input graph on ``inputs`` gives its flat outputs as
    ``reference`` (:func:`run_graph`) and ``truth`` (:func:`run_graph_promoted`, None when
    there is none), and the graph is not run again for them. They are used only when the run
    takes ``inputs``; with other inputs the check computes its own.
    """

    def __init__(
        self,
        inputs: Sequence[Any] | None = None,
        *,
        rtol: float | None = None,
        atol: float | None = None,
        raise_on_divergence: bool = False,
        names: Sequence[str] | None = None,
        reference: Sequence[Any] | None = None,
        truth: Sequence[Any] | None = None,
    ) -> None:
        self.inputs = list(inputs) if inputs is not None else None
        self.rtol, self.atol = rtol, atol
        self.raise_on_divergence = raise_on_divergence
        self.names = list(names) if names is not None else None
        self._known = (
            (list(reference), list(truth) if isinstance(truth, Sequence) else truth)
            if reference is not None
            else None
        )
        self.reference: list[Any] | None = None
        self.truth: list[Any] | None = None
        self.results: list[PassNumerics] = []
        self._inputs: list[Any] = []

    @property
    def first_divergence(self) -> PassNumerics | None:
        return next((r for r in self.results if not r.ok), None)

    @property
    def ok(self) -> bool:
        return self.first_divergence is None

    def before_pipeline(self, pipeline, gm, ctx):
        placeholders = len(gm.graph.find_nodes(op="placeholder"))
        given = self.inputs
        if given is None and ctx.sample_inputs is not None:
            given = list(ctx.sample_inputs)
        self._inputs = (
            given
            if given is not None and len(given) == placeholders
            else (sample_inputs_from_meta(gm))
        )
        self.results = []
        if self._known is not None and self._inputs is self.inputs:
            self.reference, self.truth = self._known
            return
        try:
            self.reference = run_graph(gm, self._inputs)
            self.truth = run_graph_promoted(gm, self._inputs)
        except Exception as e:
            raise FxpassError(
                "cannot verify numerics: the input graph does not run on the sample inputs "
                f"({error_summary(e)})"
            ) from e

    def after_pass(self, record, gm, ctx):
        # ctx.changed, not record.modified: a later round of a fixpoint that changed nothing
        # this time has nothing new to check
        if record.children or not ctx.changed or self.reference is None:
            return
        cmp = check_graph(
            self.reference,
            gm,
            self._inputs,
            rtol=self.rtol,
            atol=self.atol,
            names=self.names,
            truth=self.truth,
        )
        self.results.append(PassNumerics(record.name, record.spec, record.runs, cmp))
        if not cmp.ok and self.raise_on_divergence:
            raise NumericsError(f"numerics diverge after pass '{record.name}': {cmp.summary()}")
