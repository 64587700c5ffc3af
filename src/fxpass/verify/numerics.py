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
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx
from torch.utils import _pytree as pytree

from ..core.errors import FxpassError
from ..core.instrument import Instrumentation

__all__ = [
    "DEFAULT_TOLERANCES",
    "Comparison",
    "Divergence",
    "NumericsCheck",
    "NumericsError",
    "PassNumerics",
    "check_graph",
    "compare_outputs",
    "output_names",
    "program_inputs",
    "run_graph",
    "run_graph_promoted",
    "sample_args",
    "sample_inputs_from_meta",
    "tolerance_for",
    "verify_numerics",
]

# (rtol, atol) per dtype. Low-precision dtypes get room for one or two roundings, because a
# fused kernel legitimately rounds at different places than the ops it replaces.
DEFAULT_TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1e-4, 1e-5),
    torch.float16: (2e-3, 1e-3),
    torch.bfloat16: (1.6e-2, 1e-2),
    torch.complex64: (1e-4, 1e-5),
    torch.complex128: (1e-7, 1e-7),
}
_FLOAT8 = (1.25e-1, 1e-1)


class NumericsError(FxpassError):
    """The transformed program's outputs differ from the original's beyond tolerance."""


def tolerance_for(
    dtype: torch.dtype, rtol: float | None = None, atol: float | None = None
) -> tuple[float, float]:
    """The ``(rtol, atol)`` used for ``dtype``; integers and bools compare exactly."""
    if not (dtype.is_floating_point or dtype.is_complex):
        default = (0.0, 0.0)
    elif dtype.itemsize == 1:  # the float8 family
        default = _FLOAT8
    else:
        default = DEFAULT_TOLERANCES.get(dtype, DEFAULT_TOLERANCES[torch.float32])
    return (default[0] if rtol is None else rtol, default[1] if atol is None else atol)


@dataclass
class Divergence:
    """Where one output differs most: which output, which element, by how much."""

    output: int
    name: str
    index: tuple[int, ...] = ()
    expected: Any = None
    actual: Any = None
    abs_error: float = 0.0
    rel_error: float = 0.0
    mismatched: int = 0
    numel: int = 0
    dtype: str = ""
    rtol: float = 0.0
    atol: float = 0.0
    reason: str = "values"  # values | shape | dtype | type | value | number of outputs | run
    #: beyond tolerance, but no further from a float32 run of the original than the original
    #: itself is: the rounding of a low-precision dtype, not a wrong rewrite
    within_rounding: bool = False

    def __str__(self) -> str:
        if self.reason == "run":
            return f"{self.name} does not run: {self.actual}"
        if self.reason != "values":
            return (
                f"{self.name}: {self.reason} differs: expected {self.expected}, got {self.actual}"
            )
        where = f"{self.name} at {list(self.index)}" if self.index else self.name
        return (
            f"{where}: expected {_num(self.expected)}, got {_num(self.actual)} "
            f"(abs error {_num(self.abs_error)}, rel error {_num(self.rel_error)}; "
            f"{self.mismatched} of {self.numel} {self.dtype} elements outside "
            f"rtol={self.rtol:g} atol={self.atol:g})"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "output": self.output,
            "name": self.name,
            "index": list(self.index),
            "expected": _jsonable(self.expected),
            "actual": _jsonable(self.actual),
            "abs_error": _jsonable(self.abs_error),
            "rel_error": _jsonable(self.rel_error),
            "mismatched": self.mismatched,
            "numel": self.numel,
            "dtype": self.dtype,
            "rtol": self.rtol,
            "atol": self.atol,
            "reason": self.reason,
            "within_rounding": self.within_rounding,
        }


@dataclass
class Comparison:
    """The outcome of comparing two sets of outputs. True when every output is within tolerance.

    ``failures`` has one :class:`Divergence` per output out of tolerance, ``worst`` is the one
    that exceeds its tolerance most; ``max_abs_error`` / ``max_rel_error`` are over all outputs
    (also when everything passed: how close it was).
    """

    ok: bool
    outputs: int = 0
    max_abs_error: float = 0.0
    max_rel_error: float = 0.0
    failures: list[Divergence] = field(default_factory=list)
    #: outputs beyond tolerance that are no less accurate than the original (see
    #: :func:`compare_outputs`'s ``truth``)
    rounding: list[Divergence] = field(default_factory=list)
    #: dtype name -> the (rtol, atol) its outputs were compared with
    tolerances: dict[str, tuple[float, float]] = field(default_factory=dict)
    #: whether the caller gave rtol / atol (else: the defaults by dtype)
    given: bool = False

    @property
    def worst(self) -> Divergence | None:
        return self.failures[0] if self.failures else None

    def __bool__(self) -> bool:
        return self.ok

    def summary(self) -> str:
        if self.ok:
            text = (
                f"{self.outputs} output{'s match' if self.outputs != 1 else ' matches'}"
                f"{self._within()}: max abs error {_num(self.max_abs_error)}, "
                f"max rel error {_num(self.max_rel_error)}"
            )
            rtols = [r for r, _ in self.tolerances.values()]
            if rtols and self.max_rel_error > max(rtols):
                text += " (near zero, where atol applies)"
            if self.rounding:
                n = len(self.rounding)
                text += (
                    f"; {n} of them beyond tolerance but no less accurate than the original "
                    "against a float32 run (low-precision rounding)"
                )
            return text
        more = f" ({len(self.failures)} outputs differ)" if len(self.failures) > 1 else ""
        return f"{self.worst}{more}"

    __str__ = summary

    def _within(self) -> str:
        """Which tolerance applied, and why: ``within bfloat16 tolerance |error| <= ...``."""
        floats = {k: v for k, v in self.tolerances.items() if v != (0.0, 0.0)}
        if not floats:
            return " exactly" if self.tolerances else ""
        bounds = "; ".join(
            f"{_num(a)} + {_num(r)}·|expected|" + (f" for {k}" if len(floats) > 1 else "")
            for k, (r, a) in floats.items()
        )
        if self.given:
            return f" within the given tolerance (|error| <= {bounds})"
        names = " and ".join(floats)
        low = [k for k in floats if k in ("bfloat16", "float16") or k.startswith("float8")]
        why = f"; {' and '.join(low)} values round differently in fused kernels" if low else ""
        plural = "s" if len(floats) > 1 else ""
        return f" within {names} tolerance{plural} (|error| <= {bounds}{why})"

    def check(self) -> Comparison:
        """Raise :class:`NumericsError` unless the outputs matched; returns self."""
        if not self.ok:
            raise NumericsError(f"numerics differ: {self.summary()}")
        return self

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "outputs": self.outputs,
            "max_abs_error": _jsonable(self.max_abs_error),
            "max_rel_error": _jsonable(self.max_rel_error),
            "failures": [f.to_dict() for f in self.failures],
            "tolerances": {k: {"rtol": r, "atol": a} for k, (r, a) in self.tolerances.items()},
        }


def _num(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _jsonable(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if isinstance(v, (bool, int, float, str)) or v is None:
        return v
    return str(v)


# ----- comparing ------------------------------------------------------------------------------
def compare_outputs(
    expected: Any,
    actual: Any,
    *,
    rtol: float | None = None,
    atol: float | None = None,
    names: Sequence[str] | None = None,
    truth: Any = None,
) -> Comparison:
    """Compare two (nested) outputs leaf by leaf with dtype-aware tolerances.

    A leaf passes when ``|actual - expected| <= atol + rtol * |expected|`` element-wise (NaN
    matches NaN, infinities must agree). Shapes and dtypes must match exactly.

    ``truth``, the original's outputs computed in float32 (:func:`run_graph_promoted`), tells
    rounding from bugs: in bf16 or fp16 a fused kernel rounds at other places than the ops it
    replaces, and through a deep model those differences can grow past any fixed tolerance.
    A leaf out of tolerance still passes when its error against ``truth`` is at most twice
    the original's own (largest and root-mean-square), i.e. the transformed graph is about as
    accurate as the original. A wrong rewrite is far less accurate and still fails.
    """
    exp_leaves, act_leaves = pytree.tree_leaves(expected), pytree.tree_leaves(actual)
    true_leaves = pytree.tree_leaves(truth) if truth is not None else []
    if len(true_leaves) != len(exp_leaves):
        true_leaves = [None] * len(exp_leaves)
    result = Comparison(
        ok=True, outputs=len(exp_leaves), given=rtol is not None or atol is not None
    )
    if len(exp_leaves) != len(act_leaves):
        result.ok = False
        result.failures.append(
            Divergence(
                -1,
                "outputs",
                expected=len(exp_leaves),
                actual=len(act_leaves),
                reason="number of outputs",
            )
        )
        return result
    scored: list[tuple[float, Divergence]] = []
    for i, (e, a, t) in enumerate(zip(exp_leaves, act_leaves, true_leaves)):
        name = names[i] if names is not None and i < len(names) else f"output {i}"
        div, excess = _compare_leaf(i, name, e, a, rtol, atol)
        if div is None:
            continue
        if div.dtype:
            result.tolerances.setdefault(div.dtype, (div.rtol, div.atol))
        if excess > 0 and div.reason == "values" and _as_accurate(e, a, t, div.atol):
            div.within_rounding = True
            result.rounding.append(div)
            excess = -1.0
        if div.reason == "values":
            result.max_abs_error = max(result.max_abs_error, div.abs_error)
            result.max_rel_error = max(result.max_rel_error, div.rel_error)
        if excess > 0 or div.reason != "values":
            scored.append((excess, div))
    scored.sort(key=lambda t: -t[0])
    result.failures = [d for _, d in scored]
    result.ok = not result.failures
    return result


def _compare_leaf(i, name, e, a, rtol, atol) -> tuple[Divergence | None, float]:
    if not isinstance(e, torch.Tensor) or not isinstance(a, torch.Tensor):
        if isinstance(e, torch.Tensor) != isinstance(a, torch.Tensor):
            return Divergence(
                i, name, expected=type(e).__name__, actual=type(a).__name__, reason="type"
            ), math.inf
        same = e == a or (isinstance(e, float) and math.isnan(e) and math.isnan(a))
        return (
            (None, 0.0)
            if same
            else (Divergence(i, name, expected=e, actual=a, reason="value"), math.inf)
        )
    if e.shape != a.shape:
        return Divergence(
            i, name, expected=list(e.shape), actual=list(a.shape), reason="shape"
        ), math.inf
    if e.dtype != a.dtype:
        return Divergence(i, name, expected=e.dtype, actual=a.dtype, reason="dtype"), math.inf
    r, t = tolerance_for(e.dtype, rtol, atol)
    div = Divergence(
        i, name, numel=e.numel(), dtype=str(e.dtype).replace("torch.", ""), rtol=r, atol=t
    )
    if e.numel() == 0:
        return div, 0.0
    ed, ad = _as_float64(e.detach().cpu()), _as_float64(a.detach().cpu())
    both_nan = torch.isnan(ed) & torch.isnan(ad)
    same_inf = torch.isinf(ed) & (ed == ad)
    diff = (ad - ed).abs()
    diff = torch.where(both_nan | same_inf, torch.zeros_like(diff), diff)
    diff = torch.nan_to_num(diff, nan=math.inf)
    allowed = t + r * ed.abs().nan_to_num(nan=0.0, posinf=0.0)
    excess = diff - allowed
    # Relative to the expected magnitude, but never to less than atol: near zero, a
    # relative error says nothing.
    rel = diff / ed.abs().nan_to_num(nan=0.0).clamp_min(max(t, torch.finfo(torch.float32).eps))
    rel = torch.where(diff == 0, torch.zeros_like(rel), rel)
    bad = excess > 0
    div.mismatched = int(bad.sum())
    flat = int(torch.argmax(excess if div.mismatched else diff).item())
    index = tuple(int(x) for x in torch.unravel_index(torch.tensor(flat), e.shape))
    div.index = index
    div.expected = _item(e, index)
    div.actual = _item(a, index)
    div.abs_error = float(diff.max())
    div.rel_error = float(rel.max())
    return div, (float(excess.max()) if div.mismatched else -1.0)


def _as_accurate(expected: Any, actual: Any, truth: Any, atol: float) -> bool:
    """Is ``actual`` about as close to ``truth`` as ``expected`` is (see compare_outputs)?"""
    if not isinstance(truth, torch.Tensor) or truth.shape != expected.shape:
        return False
    if not expected.is_floating_point() or expected.dtype.itemsize > 2:
        return False  # float32 and wider have no rounding to forgive at this scale
    t = truth.detach().cpu().to(torch.float64)
    err_e = (_as_float64(expected.detach().cpu()) - t).abs()
    err_a = (_as_float64(actual.detach().cpu()) - t).abs()
    if not (torch.isfinite(err_e).all() and torch.isfinite(err_a).all()):
        return False
    tiny = atol * 1e-3
    worst = float(err_a.max()) <= 2 * float(err_e.max()) + tiny
    rms = float(err_a.pow(2).mean().sqrt()) <= 2 * float(err_e.pow(2).mean().sqrt()) + tiny
    return worst and rms


_LOW_PRECISION = (torch.float16, torch.bfloat16)


def _promote(value: Any) -> Any:
    if isinstance(value, torch.dtype):
        return torch.float32 if value in _LOW_PRECISION else value
    if isinstance(value, torch.Tensor) and value.dtype in _LOW_PRECISION:
        return value.float()
    return value


class _Promoted(fx.Interpreter):
    """Runs a graph in float32 wherever it would compute in float16 or bfloat16."""

    def placeholder(self, target, args, kwargs):
        return pytree.tree_map(_promote, super().placeholder(target, args, kwargs))

    def get_attr(self, target, args, kwargs):
        return pytree.tree_map(_promote, super().get_attr(target, args, kwargs))

    def call_function(self, target, args, kwargs):
        args, kwargs = pytree.tree_map(_promote, (args, kwargs))
        return super().call_function(target, args, kwargs)

    def call_method(self, target, args, kwargs):
        args, kwargs = pytree.tree_map(_promote, (args, kwargs))
        return super().call_method(target, args, kwargs)


def run_graph_promoted(gm: fx.GraphModule, inputs: Sequence[Any]) -> list[Any] | None:
    """``gm``'s outputs computed in float32 where it computes in bf16/fp16, or None.

    An estimate of the exact result, used to tell a low-precision rounding difference from a
    wrong rewrite (see :func:`compare_outputs`). None when the graph has no low-precision
    tensors or does not run promoted (an op with a fixed dtype contract).
    """
    low = any(
        isinstance(v, torch.Tensor) and v.dtype in _LOW_PRECISION
        for n in gm.graph.nodes
        for v in pytree.tree_leaves(n.meta.get("val"))
    ) or any(isinstance(x, torch.Tensor) and x.dtype in _LOW_PRECISION for x in inputs)
    if not low:
        return None
    # copies, as run_graph makes: a graph that writes to an input must not change the
    # caller's (promoted tensors are copies already)
    args = [
        x.clone() if isinstance(x, torch.Tensor) and x.dtype not in _LOW_PRECISION else x
        for x in inputs
    ]
    try:
        with torch.no_grad():
            return pytree.tree_leaves(_Promoted(gm).run(*args))
    except Exception:
        return None


def _as_float64(t: torch.Tensor) -> torch.Tensor:
    if t.is_complex():
        return torch.view_as_real(t.to(torch.complex128)).flatten(-2).abs()  # rough but robust
    return t.to(torch.float64)


def _item(t: torch.Tensor, index: tuple[int, ...]) -> Any:
    v = t[index] if index else t.reshape(())
    v = v.item()
    return round(v, 6) if isinstance(v, float) else v


# ----- inputs ---------------------------------------------------------------------------------
_INDEXING = {
    torch.ops.aten.embedding.default: (1, 0, 0),  # (arg holding indices, table arg, its dim)
}


def sample_inputs_from_meta(gm: fx.GraphModule, *, seed: int = 0) -> list[Any]:
    """Make inputs for every placeholder of ``gm`` from its ``meta['val']`` (seeded).

    Floating tensors are standard normal, booleans random, integer tensors random in a range
    that keeps indexing ops in bounds (an embedding's table size), symbolic sizes take their
    hints. Placeholders without ``meta['val']`` are an error that says so.
    """
    gen = torch.Generator().manual_seed(seed)
    inputs = []
    for node in gm.graph.find_nodes(op="placeholder"):
        if "val" not in node.meta:
            raise ValueError(
                f"placeholder '{node.name}' has no meta['val'], so no sample input can be made "
                "for it; pass sample inputs explicitly"
            )
        inputs.append(_make_value(node.meta["val"], _int_bound(node), gen))
    return inputs


def _int_bound(node: fx.Node) -> int:
    bounds = []
    for user in node.users:
        spec = _INDEXING.get(user.target)
        if spec and len(user.args) > spec[0] and user.args[spec[0]] is node:
            table = user.args[spec[1]]
            val = table.meta.get("val") if isinstance(table, fx.Node) else None
            if val is not None:
                bounds.append(_hint(val.shape[spec[2]]))
    return max(min(bounds, default=16), 1)


def _hint(size: Any) -> int:
    if isinstance(size, int):
        return size
    try:
        from torch.fx.experimental.symbolic_shapes import hint_int

        return int(hint_int(size, fallback=4))
    except Exception:
        return 4


def _make_value(val: Any, bound: int, gen: torch.Generator) -> Any:
    if isinstance(val, torch.Tensor):
        shape = [_hint(s) for s in val.shape]
        dtype = val.dtype
        if dtype == torch.bool:
            return torch.randint(0, 2, shape, generator=gen).bool()
        if dtype.is_floating_point or dtype.is_complex:
            return torch.randn(shape, generator=gen, dtype=torch.float32).to(dtype)
        return torch.randint(0, bound, shape, generator=gen).to(dtype)
    if isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return _hint(val)
    if isinstance(val, (list, tuple)):
        return type(val)(_make_value(v, bound, gen) for v in val)
    return val


def sample_args(
    program: Any, sample_inputs: Sequence[Any] | None = None
) -> tuple[list[Any], dict[str, Any]] | None:
    """``(args, kwargs)`` to call ``program`` with: ``sample_inputs`` when given, else an
    ExportedProgram's ``example_inputs``, else inputs made from the placeholders'
    ``meta['val']`` (of the GraphModule, or of the program's ``module()``). None when
    nothing is given and ``program`` is neither an ExportedProgram nor a GraphModule."""
    if sample_inputs is not None:
        return list(sample_inputs), {}
    if isinstance(program, torch.export.ExportedProgram):
        example = getattr(program, "example_inputs", None)
        if example is not None:
            args, kwargs = example
            return list(args), dict(kwargs)
        return sample_inputs_from_meta(program.module()), {}
    if isinstance(program, fx.GraphModule):
        return sample_inputs_from_meta(program), {}
    return None


def program_inputs(
    ep: torch.export.ExportedProgram, args: Sequence[Any], kwargs=None, *, strict: bool = True
) -> list:
    """The flat inputs of ``ep.graph_module``: parameters, buffers, constants, user inputs.

    Without ``strict``, a value that is not there (fewer user inputs than the program
    takes, a constant the program lacks) is None instead of an error.
    """
    from torch.export.graph_signature import InputKind

    user = iter(pytree.tree_leaves((tuple(args), dict(kwargs or {}))))
    state, consts = ep.state_dict, ep.constants
    out: list[Any] = []
    for spec in ep.graph_signature.input_specs:
        if spec.kind == InputKind.USER_INPUT:
            out.append(next(user) if strict else next(user, None))
        elif spec.kind == InputKind.TOKEN:
            out.append(torch.tensor([]))
        elif spec.target in state:
            out.append(state[spec.target])
        else:
            out.append(consts[spec.target] if strict else consts.get(spec.target))
    return out


def output_names(ep: torch.export.ExportedProgram) -> list[str]:
    """Names for the flat outputs of ``ep.graph_module`` (user outputs and mutated buffers)."""
    from torch.export.graph_signature import OutputKind

    names, user = [], 0
    for spec in ep.graph_signature.output_specs:
        if spec.kind == OutputKind.USER_OUTPUT:
            names.append(f"output {user}")
            user += 1
        else:
            names.append(f"{spec.kind.name.lower()} {spec.target}")
    return names


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
    except Exception as e:
        first = (str(e).strip().splitlines() or [""])[0][:200]
        failure = Divergence(
            -1, "the graph", expected="outputs", actual=f"{type(e).__name__}: {first}", reason="run"
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
            (list(reference), list(truth) if truth is not None else None)
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
            first = (str(e).strip().splitlines() or [""])[0][:200]
            raise FxpassError(
                "cannot verify numerics: the input graph does not run on the sample inputs "
                f"({type(e).__name__}: {first})"
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
