"""RMSNorm, residual add and int8 quantization, as patterns that match every spelling.

One pattern covers the RMSNorms of Llama, Mistral, Qwen2/Qwen3, Phi-3 and Gemma to Gemma4
(and the per-head q/k norms of Qwen3 and Gemma3/3n/4) in core ATen, training-IR, AOT and Dynamo graphs::

    out = cast?( w_term * cast?( h * rsqrt(mean(h ** 2, dim=-1, keepdim=True) + eps) ) )
    h = cast_float32?(x)        w_term = cast?(w) | cast?(w) + offset        (Gemma: 1 + w)

with ``h * h`` for ``h ** 2``; ``h * pow(..., -0.5)`` (Gemma3n, Gemma4), ``h * (1 / sqrt(...))``,
``h * sqrt(...).reciprocal()``, ``h / sqrt(...)`` and ``h / (...) ** 0.5`` for ``h * rsqrt(...)``;
either operand order
of every ``*`` and ``+``, and each op in its ATen, Edge, torch-level and method spelling;
T5's ``x * rsqrt(mean(x.float() ** 2) + eps)`` (the upcast squared, ``x`` itself multiplied
— promoted to float32 by the product, so the same numbers); ``x`` seen through views that
keep the last dimension and through no-op casts (:meth:`~fxpass.rewrite.P.through`: export
graphs put ``x.to(torch.float32)`` on float32 values, and Hugging Face models reshape between
the residual add and the norm); ``eps`` a literal or a lifted constant (Edge programs). What
the pattern cannot say, :func:`norm_ok` checks on the fake values: the mean is over the last
dimension, the weight is 1-D with that many elements, and the result has ``x``'s dtype (so
a look-alike — another reduced dimension, no ``eps``, a 2-D weight — is left alone).
"""

from __future__ import annotations

import operator
from typing import Any

import torch

from ... import ops as _ops  # noqa: F401  (registers torch.ops.fxpass)
from ...rewrite.constraint import value_of
from ...rewrite.pattern import P, Pattern

aten = torch.ops.aten
fxpass_ops = torch.ops.fxpass

MUL = {aten.mul.Tensor, operator.mul, torch.mul, "mul"}
ADD = {aten.add.Tensor, aten.add.Scalar, operator.add, torch.add, "add"}
DIV = {aten.div.Tensor, operator.truediv, torch.div, "div"}
RSQRT = {aten.rsqrt.default, torch.rsqrt, "rsqrt"}
SQRT = {aten.sqrt.default, torch.sqrt, "sqrt"}
RECIPROCAL = {aten.reciprocal.default, torch.reciprocal, "reciprocal"}
POW = {aten.pow.Tensor_Scalar, operator.pow, torch.pow, "pow"}
TORCH_MEAN = {torch.mean, "mean"}
ROUND = {aten.round.default, torch.round, "round"}
CLAMP = {aten.clamp.default, torch.clamp, "clamp"}
GETITEM = operator.getitem

NUMBER = (float, int)


def _mean(p: Pattern, dim: Pattern) -> Pattern:
    """``mean(p, dim, keepdim=True)`` in its ATen, torch-level and method spellings."""
    return P.any_of(
        P(aten.mean.dim, p, dim, True),
        P(TORCH_MEAN, p, dim, keepdim=True),
        P(TORCH_MEAN, p, dim, True),
        P(TORCH_MEAN, p, dim=dim, keepdim=True),
    )


def _inverse_root(s: Pattern) -> Pattern:
    """``1 / sqrt(s)`` spelled as ``rsqrt(s)``, ``pow(s, -0.5)`` (``s ** -0.5``: Gemma3n,
    Gemma4), ``1 / sqrt(s)`` (Dynamo's ``operator.truediv``; export's ``reciprocal(sqrt(s))
    * 1``) or ``sqrt(s).reciprocal()``."""
    root = P(SQRT, s)
    recip = P(RECIPROCAL, root)
    return P.any_of(
        P(RSQRT, s), P(POW, s, -0.5), recip, P(MUL, recip, 1), P(operator.truediv, 1, root)
    )


def _scaled(h: Pattern, var: Pattern) -> list[Pattern]:
    """``h * rsqrt(var + eps)`` (any spelling of :func:`_inverse_root`), ``h / sqrt(var +
    eps)`` and ``h / (var + eps) ** 0.5``."""
    shifted = P(ADD, var, P.scalar("eps", NUMBER))
    return [
        P(MUL, h, _inverse_root(shifted)),
        P(DIV, h, P(SQRT, shifted)),
        P(DIV, h, P(POW, shifted, 0.5)),
    ]


def _variance(h: Pattern) -> Pattern:
    square = P.any_of(P(POW, h, 2), P(MUL, h, h))
    return P.any_of(*(_mean(square, P.const("dim")).options))


def normalized(x: Pattern) -> Pattern:
    """``h * rsqrt(mean(h**2, -1, keepdim=True) + eps)`` with ``h = x`` or ``x.float()``, or
    T5's ``x * rsqrt(mean(x.float()**2, ...) + eps)``; ``x`` possibly behind views that keep
    the last dimension and no-op casts.

    Binds ``x``'s pattern, ``norm_in`` (the value the norm reads, ``x`` behind its views),
    ``eps``, ``dim``, ``upcast`` and, for T5's spelling, ``promoted`` (checked by
    :func:`norm_ok`).
    """
    xs = P.through(x).named("norm_in")
    up = P.cast(xs, torch.float32).named("upcast")
    var_up = _variance(up)
    t5 = [p.named("promoted") for p in _scaled(xs, var_up)]
    return P.any_of(*_scaled(up, var_up), *_scaled(xs, _variance(xs)), *t5)


def _maybe_cast(p: Pattern, name: str) -> Pattern:
    return P.any_of(P.cast(p).named(name), p)


def rms_norm(x: Pattern, *, fused: bool = False) -> Pattern:
    """An RMSNorm of ``x`` with a weight (``w``, optional ``offset``), spelled any way above
    (and, with ``fused``, fxpass's own ``rms_norm`` op). Binds ``x``, ``w``, ``eps``,
    ``offset`` (Gemma's 1), ``dim``, and the casts ``mid_cast``/``out_cast``; the root is
    named ``out``. Check a match with :func:`norm_ok`."""
    w = P.cast(P.node("w"), optional=True)
    w_term = P.any_of(P(ADD, w, P.scalar("offset", NUMBER)), w)
    core = P(MUL, w_term, _maybe_cast(normalized(x), "mid_cast"))
    spelled = P.any_of(P.cast(core).named("out_cast"), core)
    if not fused:
        return P.any_of(spelled, name="out")
    fused_in = P.through(x).named("norm_in")
    op = P(fxpass_ops.rms_norm.default, fused_in, P.node("w"), P.const("eps"), P.const("offset"))
    return P.any_of(op, spelled, name="out")


def _last_dim(dim: Any, rank: int) -> bool:
    if isinstance(dim, (list, tuple)):
        if len(dim) != 1:
            return False
        dim = dim[0]
    return isinstance(dim, int) and not isinstance(dim, bool) and dim in (-1, rank - 1)


def _tensor(v: Any) -> torch.Tensor | None:
    val = value_of(v)
    return val if isinstance(val, torch.Tensor) else None


_PROMOTED = (torch.float16, torch.bfloat16, torch.float32)


def norm_ok(b: dict[str, Any], x: str = "x") -> bool:
    """The matched computation (bindings ``b``) is exactly an RMSNorm over the last
    dimension of ``norm_in`` (the norm's input, bound to ``x``, behind views that keep its
    rows) whose result ``out`` has that input's dtype (what ``fxpass::rms_norm`` computes)."""
    xn = b[x]
    xv, wv, ov = _tensor(xn), _tensor(b["w"]), _tensor(b["out"])
    hv = _tensor(b.get("norm_in", xn))
    if xv is None or wv is None or ov is None or hv is None or not xv.is_floating_point():
        return False
    shape = hv.shape
    rank = len(shape)
    if "dim" in b and not _last_dim(b["dim"], rank):
        return False
    if rank < 1 or wv.dim() != 1 or wv.shape[0] != shape[-1]:
        return False
    if ov.dtype != xv.dtype or tuple(ov.shape) != tuple(shape):
        return False
    if "promoted" in b and (xv.dtype not in _PROMOTED or "upcast" not in b):
        return False  # T5's product promotes x to float32 exactly only from these
    eps = b.get("eps")
    if not isinstance(eps, NUMBER) or isinstance(eps, bool) or eps < 0:
        return False
    if not isinstance(b.get("offset", 0.0), NUMBER):
        return False
    mid = _tensor(b["mid_cast"]) if "mid_cast" in b else None
    return mid is None or mid.dtype == xv.dtype  # Llama rounds to x's dtype before the weight


def scalars(eps: Any, offset: Any = 0.0) -> tuple[float, float]:
    """``eps`` and ``weight_offset`` as the fused ops take them (Python floats)."""
    return float(eps), float(offset)


def residual_add(a: str = "x", b: str = "residual") -> Pattern:
    """``a + b`` (either order, any spelling) named ``sum``."""
    return P(ADD, P.node(a), P.node(b)).named("sum")


def add_ok(b: dict[str, Any]) -> bool:
    """The residual add is a plain same-shape, same-dtype add (``x + residual``)."""
    xs, rs, ss = _tensor(b["x"]), _tensor(b["residual"]), _tensor(b["sum"])
    if xs is None or rs is None or ss is None:
        return False
    same = tuple(xs.shape) == tuple(rs.shape) == tuple(ss.shape)
    return same and xs.dtype == rs.dtype == ss.dtype


def quantized(normed: Pattern) -> Pattern:
    """Static per-tensor int8: ``clamp(round(normed.float() / scale), -128, 127).to(int8)``."""
    scaled = P(DIV, P.cast(normed, torch.float32, optional=True), P.node("scale")).named("scaled")
    clamped = P.any_of(
        P(CLAMP, P(ROUND, scaled), -128, 127),
        P(CLAMP, P(ROUND, scaled), min=-128, max=127),
    )
    return P.cast(clamped, torch.int8)


def quant_ok(b: dict[str, Any]) -> bool:
    """The scale is a one-element float32 tensor and the division happens in float32."""
    scale, scaled = _tensor(b["scale"]), _tensor(b["scaled"])
    if scale is None or scaled is None:
        return False
    return scale.numel() == 1 and scale.dtype == torch.float32 and scaled.dtype == torch.float32
