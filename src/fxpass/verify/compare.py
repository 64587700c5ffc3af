"""Comparing outputs: per-dtype tolerances, where two results diverge and by how much, and a
float32 run of a graph that computes in bf16/fp16, which says whether a low-precision result
is as accurate as the original's (the truth both are measured against). When that run
fails, the comparison says so instead of quietly losing the yardstick.

>>> cmp = compare_outputs([torch.ones(2)], [torch.ones(2) + 1e-7])   # doctest: +SKIP
>>> bool(cmp)                                                        # doctest: +SKIP
True
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx
from torch.utils import _pytree as pytree

from ..core.errors import FxpassError
from ..fxutil.messages import error_summary

__all__ = [
    "DEFAULT_TOLERANCES",
    "Comparison",
    "Divergence",
    "NumericsError",
    "ReferenceUnavailable",
    "check_tolerances",
    "compare_outputs",
    "low_precision",
    "run_graph_promoted",
    "tolerance_for",
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


def check_tolerances(rtol: float | None, atol: float | None) -> None:
    """Refuse a negative (or NaN) tolerance: ``|a - e| <= atol + rtol * |e|`` could then fail
    on equal values and report a divergence with error 0."""
    for name, value in (("rtol", rtol), ("atol", atol)):
        if value is not None and not value >= 0:
            raise ValueError(f"{name} must be a number >= 0, got {value}")


def tolerance_for(
    dtype: torch.dtype, rtol: float | None = None, atol: float | None = None
) -> tuple[float, float]:
    """The ``(rtol, atol)`` used for ``dtype``; integers and bools compare exactly."""
    check_tolerances(rtol, atol)
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
    #: beyond tolerance in a low-precision dtype, and the float32 run of the original that
    #: would tell rounding from a wrong rewrite failed: why
    no_reference: str = ""

    def __str__(self) -> str:
        if self.reason == "run":
            return f"{self.name} does not run: {self.actual}"
        if self.reason != "values":
            return (
                f"{self.name}: {self.reason} differs: expected {self.expected}, got {self.actual}"
            )
        where = f"{self.name} at {list(self.index)}" if self.index else self.name
        unknown = (
            f"; whether this is {self.dtype} rounding or a wrong rewrite is unknown: "
            f"{self.no_reference}"
            if self.no_reference
            else ""
        )
        return (
            f"{where}: expected {_num(self.expected)}, got {_num(self.actual)} "
            f"(abs error {_num(self.abs_error)}, rel error {_num(self.rel_error)}; "
            f"{self.mismatched} of {self.numel} {self.dtype} elements outside "
            f"rtol={self.rtol:g} atol={self.atol:g}){unknown}"
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
            "no_reference": self.no_reference,
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
    #: why the float32 run of the original (``truth``) could not be made, if it failed
    no_reference: str = ""

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
            if self.no_reference:
                text += (
                    f"; no float32 reference ({self.no_reference}): low-precision outputs were "
                    "judged by tolerance alone"
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
            "no_reference": self.no_reference,
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
    accurate as the original. A wrong rewrite is far less accurate and still fails. When
    ``truth`` is a :class:`ReferenceUnavailable` (the float32 run failed), each low-precision
    leaf out of tolerance fails and says why nothing could be forgiven.
    """
    check_tolerances(rtol, atol)
    exp_leaves, act_leaves = pytree.tree_leaves(expected), pytree.tree_leaves(actual)
    missing = truth.why if isinstance(truth, ReferenceUnavailable) else ""
    true_leaves = pytree.tree_leaves(truth) if truth is not None and not missing else []
    if len(true_leaves) != len(exp_leaves):
        true_leaves = [None] * len(exp_leaves)
    result = Comparison(
        ok=True,
        outputs=len(exp_leaves),
        given=rtol is not None or atol is not None,
        no_reference=missing,
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
        elif excess > 0 and div.reason == "values" and missing and _rounds(e):
            div.no_reference = missing
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
    if not _rounds(expected):
        return False
    t = truth.detach().cpu().to(torch.float64)
    err_e = (_as_float64(expected.detach().cpu()) - t).abs()
    err_a = (_as_float64(actual.detach().cpu()) - t).abs()
    if not (torch.isfinite(err_e).all() and torch.isfinite(err_a).all()):
        return False
    tiny = atol * 1e-3
    worst = float(err_a.max()) <= 2 * float(err_e.max()) + tiny
    rms = float(err_a.pow(2).mean().sqrt()) <= 2 * float(err_e.pow(2).mean().sqrt()) + tiny
    return worst and rms


def _rounds(expected: torch.Tensor) -> bool:
    """Has ``expected`` a dtype whose rounding a float32 run can forgive? (float32 and
    wider have no rounding to forgive at this scale)"""
    return expected.is_floating_point() and expected.dtype.itemsize <= 2


_LOW_PRECISION = (torch.float16, torch.bfloat16)


def _promote(value: Any) -> Any:
    if isinstance(value, torch.dtype):
        return torch.float32 if value in _LOW_PRECISION else value
    if isinstance(value, torch.Tensor) and value.dtype in _LOW_PRECISION:
        return value.float()
    return value


class _PromotedCall:
    """A subgraph (``wrap_with_set_grad_enabled``'s, ``cond``'s branches) run promoted, as a
    higher-order op calls it in eager mode."""

    def __init__(self, gm: fx.GraphModule) -> None:
        self.gm = gm

    def __call__(self, *args: Any) -> Any:
        return _Promoted(self.gm).run(*args)


class _Promoted(fx.Interpreter):
    """Runs a graph in float32 wherever it would compute in float16 or bfloat16."""

    def placeholder(self, target, args, kwargs):
        return pytree.tree_map(_promote, super().placeholder(target, args, kwargs))

    def get_attr(self, target, args, kwargs):
        value = super().get_attr(target, args, kwargs)
        if isinstance(value, fx.GraphModule):  # a subgraph a higher-order op calls: promoted too
            return _PromotedCall(value)
        return pytree.tree_map(_promote, value)

    def call_function(self, target, args, kwargs):
        args, kwargs = pytree.tree_map(_promote, (args, kwargs))
        return super().call_function(target, args, kwargs)

    def call_method(self, target, args, kwargs):
        args, kwargs = pytree.tree_map(_promote, (args, kwargs))
        return super().call_method(target, args, kwargs)


@dataclass(frozen=True)
class ReferenceUnavailable:
    """What :func:`run_graph_promoted` returns when the float32 run fails: ``why``. Given to
    :func:`compare_outputs` as ``truth``, the divergences it finds in bf16/fp16 say that
    rounding could not be told from a wrong rewrite, and why."""

    why: str


def low_precision(gm: fx.GraphModule, inputs: Sequence[Any] = ()) -> bool:
    """Does ``gm`` compute in float16 or bfloat16 (by its values' metadata or its inputs)?"""
    return any(
        isinstance(v, torch.Tensor) and v.dtype in _LOW_PRECISION
        for n in gm.graph.nodes
        for v in pytree.tree_leaves(n.meta.get("val"))
    ) or any(isinstance(x, torch.Tensor) and x.dtype in _LOW_PRECISION for x in inputs)


def run_graph_promoted(
    gm: fx.GraphModule, inputs: Sequence[Any]
) -> list[Any] | ReferenceUnavailable | None:
    """``gm``'s outputs computed in float32 where it computes in bf16/fp16.

    An estimate of the exact result, used to tell a low-precision rounding difference from a
    wrong rewrite (see :func:`compare_outputs`). None when the graph has no low-precision
    tensors (nothing to tell apart); a :class:`ReferenceUnavailable` saying why when it does
    not run promoted (an op with a fixed dtype contract).
    """
    if not low_precision(gm, inputs):
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
    except Exception as e:  # broad: reported — the comparison says the reference failed, why
        return ReferenceUnavailable(f"the float32 run of the original failed ({error_summary(e)})")


def _as_float64(t: torch.Tensor) -> torch.Tensor:
    if t.is_complex():
        return torch.view_as_real(t.to(torch.complex128)).flatten(-2).abs()  # rough but robust
    return t.to(torch.float64)


def _item(t: torch.Tensor, index: tuple[int, ...]) -> Any:
    v = t[index] if index else t.reshape(())
    v = v.item()
    return round(v, 6) if isinstance(v, float) else v
