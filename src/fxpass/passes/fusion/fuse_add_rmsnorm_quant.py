"""``fuse_add_rmsnorm_quant``: residual add + RMSNorm + static int8 quantization, in one op."""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

from ...core.context import PassContext
from ...core.pass_registry import register
from ...fxutil.layout import same_layout
from ...rewrite.constraint import value_of
from ...rewrite.driver import RuleSet, rewrite
from ...rewrite.pattern import P
from ...rewrite.rule import Rule
from ._keep_layout import call, fake_result, keep_layout
from ._norm_patterns import (
    GETITEM,
    add_ok,
    norm_ok,
    quant_ok,
    quantized,
    residual_add,
    rms_norm,
    scalars,
)

__all__ = ["RULES", "fuse_add_rmsnorm_quant"]

_QUANT = torch.ops.fxpass.fused_add_rmsnorm_quant.default


def _from_fused(
    x: Any, residual: Any, w: Any, scale: Any, eps: float, offset: float, fused: Any, match: Any
) -> Any:
    args = (x, residual, w, scale, *scalars(eps, offset))
    out = call(_QUANT, *args)
    vals = fake_result(_QUANT, *args) or (None, None)
    old = value_of(fused.node)
    old_sum = old[1] if isinstance(old, (tuple, list)) and len(old) == 2 else None
    # the sum is read through the old op's tuple, so no copy can restore it: it must agree
    if not isinstance(vals[1], torch.Tensor) or not isinstance(old_sum, torch.Tensor):
        return None
    if not same_layout(vals[1], old_sum):
        return None
    quantized = keep_layout(out[0], vals[0], match.root)
    return None if quantized is None else (quantized, out)  # the new op takes the old one's place


def _from_spelled(
    x: Any, residual: Any, w: Any, scale: Any, eps: float, offset: float = 0.0, **b: Any
) -> Any:
    args = (x, residual, w, scale, *scalars(eps, offset))
    out = call(_QUANT, *args)
    vals = fake_result(_QUANT, *args) or (None, None)
    quantized = keep_layout(out[0], vals[0], b["match"].root)
    total = keep_layout(out[1], vals[1], b["sum"])
    return None if quantized is None or total is None else (quantized, total)


def _is_add_norm_quant(**b: Any) -> bool:
    norm = dict(b, x=b["sum"])
    return norm_ok(norm) and add_ok(b) and quant_ok(b)


_fused_op = P(
    torch.ops.fxpass.fused_add_rmsnorm.default,
    P.node("x"),
    P.node("residual"),
    P.node("w"),
    P.const("eps"),
    P.const("offset"),
).named("fused")

RULES = RuleSet(
    "fuse_add_rmsnorm_quant",
    [
        Rule(
            quantized(P(GETITEM, _fused_op, 0)),
            _from_fused,
            name="quant_after_fused_add_rms_norm",
            outputs=["fused"],
            where=lambda **b: quant_ok(b),
        ),
        Rule(
            quantized(rms_norm(residual_add("x", "residual"), fused=True)),
            _from_spelled,
            name="add_rms_norm_quant",
            outputs=["sum"],
            where=_is_add_norm_quant,
        ),
    ],
    once=True,
)


@register(
    "fuse_add_rmsnorm_quant",
    origin="fxpass",
    statistics={
        "rewrites": "add + norm + quantization sites fused",
        "add_rms_norm_quant.matched": "sites spelled out in full",
        "quant_after_fused_add_rms_norm.matched": "sites already fused by fuse_add_rmsnorm",
    },
    keeps=("val", "layouts", "stack_trace", "nn_module_stack", "provenance"),
    edits="editor",
)
def fuse_add_rmsnorm_quant(gm: fx.GraphModule, ctx: PassContext | None = None) -> bool:
    """Fuse residual add + RMSNorm + static per-tensor int8 quantization (SGLang's W8A8
    ``NpuAddRmsNormQuantFuse``) into ``fxpass::fused_add_rmsnorm_quant(x, residual, w,
    scale, eps, weight_offset) -> (int8, sum)``.

    The quantization is ``clamp(round(normed.float() / scale), -128, 127).to(torch.int8)``
    with a one-element float32 ``scale``; the norm is spelled any way ``fuse_rmsnorm``
    knows, or is already an ``fxpass::rms_norm`` or ``fxpass::fused_add_rmsnorm`` (so this
    pass may run before or after ``fuse_add_rmsnorm``). The normalized value must be used
    only by the quantization; the residual sum stays available to its other users.

    Before / after::

        %sum = aten.add(%x, %residual)
        %n = <RMSNorm of %sum with %w>
        %q = aten._to_copy(aten.clamp(aten.round(aten.div(%n, %scale)), -128, 127),
                           dtype=torch.int8)
               ->  %f = fxpass.fused_add_rmsnorm_quant(%x, %residual, %w, %scale, 1e-06, 0.0)
                   %q = getitem(%f, 0);  %sum = getitem(%f, 1)

    Called as a plain function (no ``ctx``), it rewrites as :func:`~fxpass.rewrite.rewrite`
    does without one.
    """
    return rewrite(gm, RULES, once=True, ctx=ctx).modified
