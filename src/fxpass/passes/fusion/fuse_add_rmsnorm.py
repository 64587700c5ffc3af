"""``fuse_add_rmsnorm``: a residual add feeding an RMSNorm becomes ``fxpass::fused_add_rmsnorm``."""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

from ...core.context import PassContext
from ...core.pass_registry import register
from ...rewrite.driver import RuleSet, rewrite
from ...rewrite.rule import Rule
from ._keep_layout import call, fake_result, keep_layout
from ._norm_patterns import add_ok, norm_ok, residual_add, rms_norm, scalars

__all__ = ["RULES", "fuse_add_rmsnorm"]


_FUSED = torch.ops.fxpass.fused_add_rmsnorm.default


def _fused_add_rms_norm(
    x: Any, residual: Any, w: Any, eps: float, out: Any, sum: Any, offset: float = 0.0
) -> Any:
    args = (x, residual, w, *scalars(eps, offset))
    fused = call(_FUSED, *args)
    vals = fake_result(_FUSED, *args) or (None, None)
    normed = keep_layout(fused[0], vals[0], out)
    total = keep_layout(fused[1], vals[1], sum)
    return None if normed is None or total is None else (normed, total)


def _is_add_norm(**b: Any) -> bool:
    return norm_ok(b, x="sum") and add_ok(b)  # the norm reads the sum


RULES = RuleSet(
    "fuse_add_rmsnorm",
    [
        Rule(
            rms_norm(residual_add("x", "residual"), fused=True),
            _fused_add_rms_norm,
            name="add_rms_norm",
            outputs=["sum"],
            where=_is_add_norm,
            replay=True,  # reads the values' metadata and the literals only
        )
    ],
    once=True,
)


@register(
    "fuse_add_rmsnorm",
    origin="fxpass",
    statistics={
        "rewrites": "residual adds fused with their norm",
        "add_rms_norm.matched": "add + norm sites found",
    },
    keeps=("val", "layouts", "stack_trace", "nn_module_stack", "provenance"),
    edits="editor",
)
def fuse_add_rmsnorm(gm: fx.GraphModule, ctx: PassContext | None = None) -> bool:
    """Fuse a residual add and the RMSNorm it feeds into
    ``fxpass::fused_add_rmsnorm(x, residual, w, eps, weight_offset) -> (normed, sum)``.

    The norm may be spelled any way :func:`~fxpass.passes.fusion.fuse_rmsnorm.fuse_rmsnorm`
    recognizes, or already be an ``fxpass::rms_norm``. The sum stays available: its other
    users (the next residual add) read the fused op's second result. Only a plain add of
    two same-shape, same-dtype tensors is fused (a broadcast add is not); an add whose sum
    the norm does not read is left alone. Both results keep the layouts the replaced
    nodes had (see :func:`~fxpass.passes.fusion.fuse_rmsnorm.fuse_rmsnorm`).

    Before / after::

        %sum = aten.add(%x, %residual)
        %out = <RMSNorm of %sum with %w>
        %next = aten.add(%sum, %h)
                        ->  %f = fxpass.fused_add_rmsnorm(%x, %residual, %w, 1e-06, 0.0)
                            %out = getitem(%f, 0)
                            %next = aten.add(getitem(%f, 1), %h)

    Called as a plain function (no ``ctx``), it rewrites as :func:`~fxpass.rewrite.rewrite`
    does without one.
    """
    return rewrite(gm, RULES, once=True, ctx=ctx).modified
