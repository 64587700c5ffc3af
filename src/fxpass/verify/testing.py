"""A test harness for pass authors: capture a model, run a pass, check what it did.

The generic harness TensorRT-LLM's pass tests use, and ExecuTorch's declarative pass tests:
capture a model the way a backend would (``export``, ``aot``, ``dynamo``, ``trace``), count
ops before and after the pass, require some ops gone, compare numerics with the original,
and keep the printed graph as a snapshot file that a later run must reproduce.

>>> from fxpass.verify.testing import check_pass
>>> aten = torch.ops.aten                                                 # doctest: +SKIP
>>> check_pass(                                                           # doctest: +SKIP
...     "fuse_add_rmsnorm", model, model.example_inputs(),
...     before={aten.rsqrt.default: 5}, after={"fxpass.fused_add_rmsnorm": 4},
...     absent_after=[aten.pow.Tensor_Scalar], snapshot="snapshots/fuse.txt",
... )

Every failed expectation is an ``AssertionError`` that says what was expected and found.
Snapshots are written when missing, and rewritten when ``FXPASS_UPDATE_SNAPSHOTS=1``.
"""

from __future__ import annotations

import difflib
import os
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import fx

from ..fxutil.files import write_atomic
from ..fxutil.graph_forms import GraphForm, spelled
from .compare import Comparison, compare_outputs, run_graph_promoted
from .inputs import program_inputs
from .invariants import keeps_metadata
from .layouts import check_layouts
from .numerics import run_graph

__all__ = [
    "CAPTURES",
    "CAPTURE_FORMS",
    "Captured",
    "PassCheck",
    "capture",
    "check_pass",
    "count_ops",
    "op_counts",
]

#: ``capture(how=)``'s names for the graph forms (:mod:`fxpass.fxutil.graph_forms`) it makes:
#: ``export`` is the core-ATen form ``aten``, ``export_ir`` the undecomposed ``export``
CAPTURE_FORMS = spelled(
    {"export": "aten", "export_ir": "export", "aot": "aot", "dynamo": "dynamo", "trace": "fx"}
)
CAPTURES = tuple(CAPTURE_FORMS)
UPDATE_ENV = "FXPASS_UPDATE_SNAPSHOTS"


@dataclass
class Captured:
    """A captured graph and the flat inputs its placeholders take."""

    graph_module: fx.GraphModule
    inputs: list[Any]
    how: str
    program: torch.export.ExportedProgram | None = None

    @property
    def form(self) -> GraphForm:
        """The graph form captured (``how`` is :func:`capture`'s name for it)."""
        return CAPTURE_FORMS[self.how]


def capture(model: torch.nn.Module, example_inputs: Sequence[Any], how: str = "export") -> Captured:
    """Capture ``model`` as a backend would.

    ``how``: ``export`` (``torch.export`` then core ATen decompositions, the usual pass
    input), ``export_ir`` (export without decompositions), ``aot`` (AOTAutograd's functional
    ATen forward graph), ``dynamo`` (the torch-level graph a ``torch.compile`` backend gets),
    ``trace`` (``torch.fx.symbolic_trace``).
    """
    args = tuple(example_inputs)
    if how in ("export", "export_ir"):
        ep = torch.export.export(model, args)
        if how == "export":
            ep = ep.run_decompositions()
        return Captured(ep.graph_module, program_inputs(ep, args), how, ep)
    if how == "aot":
        from torch._functorch.aot_autograd import aot_export_module

        wrapped = _TupleOutputs(model)  # AOT export wants a tuple of outputs
        gm, sig = aot_export_module(wrapped, args, trace_joint=False)
        named = {**dict(wrapped.named_parameters()), **dict(wrapped.named_buffers())}
        inputs = [named[n] for n in (*sig.parameters, *sig.buffers)] + list(args)
        return Captured(gm, inputs, how)
    if how == "dynamo":
        return _dynamo_capture(model, args)
    if how == "trace":
        return Captured(fx.symbolic_trace(model), list(args), how)
    raise ValueError(f"unknown capture {how!r}; use one of {', '.join(CAPTURES)}")


class _TupleOutputs(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, *args: Any) -> tuple:
        out = self.model(*args)
        return out if isinstance(out, tuple) else (out,)


def _dynamo_capture(model: torch.nn.Module, args: tuple) -> Captured:
    graphs: list[tuple[fx.GraphModule, list[Any]]] = []

    def backend(gm: fx.GraphModule, example_inputs: list[Any]):
        graphs.append((gm, list(example_inputs)))
        return gm.forward

    torch._dynamo.reset()
    try:
        torch.compile(model, backend=backend, fullgraph=True)(*args)
    finally:
        torch._dynamo.reset()
    gm, inputs = graphs[0]
    return Captured(gm, inputs, "dynamo")


# ----- counting ops ---------------------------------------------------------------------------
def _key_matches(key: Any, target: Any) -> bool:
    if isinstance(key, str):
        text = str(target)
        if text == key or text.startswith(key + "."):
            return True
        name = getattr(target, "__name__", "")
        return name == key or f"{getattr(target, '__module__', '')}.{name}" == key
    if isinstance(key, torch._ops.OpOverloadPacket):
        return getattr(target, "overloadpacket", None) is key
    return target is key


def _label(key: Any) -> str:
    return key if isinstance(key, str) else str(key)


def count_ops(gm: fx.GraphModule, key: Any) -> int:
    """How many ``call_function`` nodes call ``key``: an op overload, a packet (any overload),
    a name like ``"aten.add.Tensor"``, ``"aten.add"`` or ``"fxpass.rms_norm"``, or a function."""
    return sum(1 for n in gm.graph.nodes if n.op == "call_function" and _key_matches(key, n.target))


def op_counts(gm: fx.GraphModule) -> Counter[str]:
    """Every ``call_function`` target in ``gm`` with how often it appears."""
    return Counter(str(n.target) for n in gm.graph.nodes if n.op == "call_function")


def _expect(gm: fx.GraphModule, counts: Mapping[Any, int], when: str) -> list[str]:
    problems = []
    for key, want in counts.items():
        got = count_ops(gm, key)
        if got != want:
            problems.append(f"expected {want} x {_label(key)} {when} the pass, found {got}")
    return problems


# ----- the harness ----------------------------------------------------------------------------
@dataclass
class PassCheck:
    """What :func:`check_pass` saw: counts before/after, the run's result, the numerics."""

    captured: Captured
    result: Any
    counts_before: Counter[str]
    counts_after: Counter[str]
    comparison: Comparison | None = None
    snapshot: Path | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def graph_module(self) -> fx.GraphModule:
        return self.result.graph_module

    @property
    def report(self) -> Any:
        return self.result.report


def check_pass(
    pass_: Any,
    model: torch.nn.Module | Captured,
    example_inputs: Sequence[Any] | None = None,
    *,
    capture_with: str = "export",
    before: Mapping[Any, int] | None = None,
    after: Mapping[Any, int] | None = None,
    absent_after: Iterable[Any] = (),
    modified: bool | None = None,
    numerics: bool = True,
    layouts: bool = True,
    contracts: bool = True,
    rtol: float | None = None,
    atol: float | None = None,
    snapshot: str | os.PathLike | None = None,
) -> PassCheck:
    """Capture ``model``, run ``pass_`` on it and check every expectation given.

    ``pass_`` is anything a pipeline takes (a pass, a function, a registered name or a spec
    string such as ``"remove_assert_ops,fuse_add_rmsnorm"``). ``model`` is a module (captured
    with ``capture_with``) or an already :class:`Captured` graph. ``before``/``after`` map ops
    to expected counts; ``absent_after`` ops must be gone; ``modified`` is the expected
    honesty flag; ``numerics`` compares outputs with the original (dtype-aware tolerances);
    ``snapshot`` is a text file holding the printed graph after the pass; ``layouts`` runs
    :func:`~fxpass.verify.check_layouts` on the result (new nodes record what their fake
    kernels give, their users still fit); ``contracts`` holds each pass to the metadata it
    declares it keeps (:func:`~fxpass.verify.keeps_metadata`).
    """
    from ..core.pipeline import Pipeline

    if isinstance(model, Captured):
        captured = model
    else:
        if example_inputs is None:
            example = getattr(model, "example_inputs", None)
            if not callable(example):
                raise TypeError("check_pass needs example_inputs for this model")
            example_inputs = example()
        captured = capture(model, example_inputs, capture_with)
    gm = captured.graph_module
    problems = _expect(gm, before or {}, "before")
    counts_before = op_counts(gm)
    reference = run_graph(gm, captured.inputs) if numerics else None
    truth = run_graph_promoted(gm, captured.inputs) if numerics else None
    pipe = Pipeline.parse(pass_) if isinstance(pass_, str) else Pipeline([pass_])
    if contracts:
        pipe.add_checks(keeps_metadata())
    result = pipe.run(gm, captured.inputs)
    out = result.graph_module
    check = PassCheck(captured, result, counts_before, op_counts(out))
    problems += _expect(out, after or {}, "after")
    for key in absent_after:
        if (n := count_ops(out, key)) != 0:
            problems.append(f"expected no {_label(key)} after the pass, found {n}")
    if layouts:
        problems += [f"layout: {p}" for p in check_layouts(out)]
    if modified is not None and result.modified != modified:
        problems.append(f"expected modified={modified}, the pass reported {result.modified}")
    if reference is not None:
        check.comparison = compare_outputs(
            reference, run_graph(out, captured.inputs), rtol=rtol, atol=atol, truth=truth
        )
        if not check.comparison.ok:
            problems.append(f"numerics differ after the pass: {check.comparison.summary()}")
    if snapshot is not None and not problems:
        check.snapshot = Path(snapshot)
        problems += _check_snapshot(check.snapshot, str(out.graph).rstrip() + "\n")
    check.problems = problems
    if problems:
        raise AssertionError(f"pass {pipe}: " + "; ".join(problems))
    return check


def _check_snapshot(path: Path, text: str) -> list[str]:
    if path.exists() and os.environ.get(UPDATE_ENV) != "1":
        old = path.read_text()
        if old == text:
            return []
        diff = difflib.unified_diff(
            old.splitlines(), text.splitlines(), "snapshot", "now", lineterm="", n=1
        )
        shown = "\n".join(list(diff)[:60])
        return [
            f"the printed graph differs from snapshot {path} "
            f"(set {UPDATE_ENV}=1 to accept the new graph):\n{shown}"
        ]
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text)
    return []
