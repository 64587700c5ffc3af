"""``fuse_rmsnorm``: every spelling of RMSNorm becomes one ``fxpass::rms_norm``."""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

from ...core.context import PassContext
from ...core.pass_registry import register
from ...rewrite.driver import RuleSet, rewrite
from ...rewrite.pattern import P
from ...rewrite.rule import Rule
from ._keep_layout import call, fake_result, keep_layout
from ._norm_patterns import norm_ok, rms_norm, scalars

__all__ = ["RULES", "fuse_rmsnorm"]


_RMS = torch.ops.fxpass.rms_norm.default


def _fused_rms_norm(x: Any, w: Any, eps: float, out: Any, offset: float = 0.0) -> Any:
    args = (x, w, *scalars(eps, offset))
    return keep_layout(call(_RMS, *args), fake_result(_RMS, *args), out)


def _is_norm(**b: Any) -> bool:
    return norm_ok(b)


RULES = RuleSet(
    "fuse_rmsnorm",
    [
        Rule(
            rms_norm(P.node("x")),
            _fused_rms_norm,
            name="rms_norm",
            where=_is_norm,
            replay=True,  # reads the values' metadata and the literals only
        )
    ],
    once=True,
)


@register(
    "fuse_rmsnorm",
    origin="fxpass",
    statistics={
        "rewrites": "norms fused",
        "rms_norm.tried": "nodes the norm pattern was tried at",
        "rms_norm.matched": "norms found",
    },
    keeps=("val", "layouts", "stack_trace", "nn_module_stack", "provenance"),
    edits="editor",
)
def fuse_rmsnorm(gm: fx.GraphModule, ctx: PassContext | None = None) -> bool:
    """Fuse each RMSNorm — in any spelling of Llama, Mistral, Qwen2/3, Phi-3 or Gemma, with
    or without a float32 upcast, weight first or last, any ``eps``, Gemma's ``(1 + w)``,
    per-head q/k norms — into ``fxpass::rms_norm(x, w, eps, weight_offset)``.

    Works on core ATen, export, AOT and Dynamo graphs (it reads the fake values in the
    nodes' metadata). A site that only looks like a norm (mean over another dimension, no
    ``eps``, a weight that is not 1-D, a result in another dtype) is left alone. Export's
    assertion nodes on the norm's intermediates are removed with it. The fused result has
    the layout the norm's result had (its users were traced against it): where the op's
    layout differs — an upcast of a sliced ``x`` is contiguous, the op follows ``x`` — a
    copy restores it, and a norm whose result is not dense is left alone.

    Before / after (Llama, core ATen)::

        %h = aten._to_copy(%x, dtype=torch.float32)
        %v = aten.mean.dim(aten.pow(%h, 2), [-1], True)
        %n = aten.mul(%h, aten.rsqrt(aten.add(%v, 1e-06)))
        %out = aten.mul(%w, aten._to_copy(%n, dtype=torch.bfloat16))
                                    ->  %out = fxpass.rms_norm(%x, %w, 1e-06, 0.0)

    Called as a plain function (no ``ctx``), it rewrites as :func:`~fxpass.rewrite.rewrite`
    does without one.
    """
    return rewrite(gm, RULES, once=True, ctx=ctx).modified
