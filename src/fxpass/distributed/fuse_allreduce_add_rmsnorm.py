"""``fuse_allreduce_add_rmsnorm``: all-reduce, residual add and RMSNorm become one op.

After tensor-parallel sharding every layer ends the same way: the row-parallel projection's
partial sums are all-reduced, added to the residual stream, and the sum is normalized for
the next block. This pass fuses the three into ``fxpass::all_reduce_add_rmsnorm``
(:mod:`fxpass.ops.collective`), as vLLM and TensorRT-LLM do on GPUs. The norm may be
spelled any way the norm fusions recognize, or already be fused with the add
(``fxpass::fused_add_rmsnorm``, from ``fuse_add_rmsnorm``); an all-reduce followed by
reshapes is first moved below them. Only a sum all-reduce whose result feeds nothing but
the add is fused; the process group travels with it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx
from torch.fx import Proxy

from ..core.context import PassContext
from ..core.pass_registry import REGISTRY
from ..fxutil.layout import same_layout
from ..passes.fusion import ADD, add_ok, fake_result, keep_layout, norm_ok, rms_norm, scalars
from ..rewrite.constraint import value_of
from ..rewrite.driver import RuleSet, rewrite
from ..rewrite.pattern import P
from ..rewrite.rule import Rule
from .collectives import C10D, sink_below_views, sum_all_reduces
from .strategy import handed_context

__all__ = ["RULES", "fuse_allreduce_add_rmsnorm"]

_FUSED = torch.ops.fxpass.fused_add_rmsnorm.default
_OP = torch.ops.fxpass.all_reduce_add_rmsnorm.default


def _reduced(name: str) -> Any:
    """``wait_tensor(all_reduce(partial, "sum", group))``, the root named ``name``."""
    reduce = P(C10D.all_reduce.default, P.node("partial"), "sum", P.const("group"))
    return P(C10D.wait_tensor.default, reduce).named(name)


def _kept(partial, residual, w, eps, offset, group, normed_old, sum_old) -> Any:
    """The fused op's two results in the layouts of the values they replace (checked
    against its fake kernel, see :func:`fxpass.passes.fusion.keep_layout`), or None."""
    args = (partial, residual, w, *scalars(eps, offset), group)
    fused = _OP(*args)
    vals = fake_result(_OP, *args) or (None, None)
    normed = keep_layout(fused[0], vals[0], normed_old)
    total = keep_layout(fused[1], vals[1], sum_old)
    return None if normed is None or total is None else (normed, total)


def _fused(partial, residual, w, eps, group, offset=0.0, **b: Any) -> Any:
    return _kept(partial, residual, w, eps, offset, group, b["out"], b["sum"])


def _from_fused(partial, residual, w, eps, offset, group, fused) -> Any:
    """The all-reduce folded into a ``fused_add_rmsnorm``: its results take the tuple's
    place where the fake kernel gives the layouts the tuple had (else the site is left)."""
    args = (partial, residual, w, *scalars(eps, offset), group)
    new, old = fake_result(_OP, *args), value_of(fused.node if isinstance(fused, Proxy) else fused)
    if new is None or not isinstance(old, (tuple, list)) or len(old) != len(new):
        return None
    if not all(isinstance(o, torch.Tensor) and same_layout(n, o) for n, o in zip(new, old)):
        return None
    return _OP(*args)


def _is_add_norm(**b: Any) -> bool:
    b["x"], b["x_in"] = b["sum"], b["x"]
    ok = norm_ok(b)
    b["x"] = b.pop("x_in")
    return ok and add_ok(b)


def _same(**b: Any) -> bool:
    return add_ok({"x": b["x"], "residual": b["residual"], "sum": b["x"]})


_ADD_NORM = Rule(
    rms_norm(P(ADD, _reduced("x"), P.node("residual")).named("sum"), fused=True),
    _fused,
    name="all_reduce_add_rms_norm",
    outputs=["sum"],
    where=_is_add_norm,
)


def _on_fused(first: Any, second: Any, name: str) -> Rule:
    pattern = P(_FUSED, first, second, P.node("w"), P.const("eps"), P.const("offset"))
    pattern = pattern.named("fused")
    return Rule(pattern, _from_fused, name=name, where=_same)


RULES = RuleSet(
    "fuse_allreduce_add_rmsnorm",
    [
        _ADD_NORM,
        _on_fused(_reduced("x"), P.node("residual"), "all_reduce_fused_add_rms_norm"),
        _on_fused(P.node("residual"), _reduced("x"), "fused_add_rms_norm_of_all_reduce"),
    ],
    once=True,
)


@REGISTRY.register(
    "fuse_allreduce_add_rmsnorm",
    origin="fxpass",
    statistics={
        "rewrites": "all-reduces fused with the residual add and norm after them",
    },
)
def fuse_allreduce_add_rmsnorm(gm: fx.GraphModule, ctx: PassContext | None = None) -> bool:
    """Fuse a sum all-reduce, the residual add it feeds and the RMSNorm of the sum into
    ``fxpass::all_reduce_add_rmsnorm(partial, residual, w, eps, weight_offset, group)``.

    Before / after::

        %ar = _c10d_functional.all_reduce(%partial, "sum", "0")
        %x = _c10d_functional.wait_tensor(%ar)
        %sum = aten.add(%x, %residual)
        %out = <RMSNorm of %sum with %w>
                        ->  %f = fxpass.all_reduce_add_rmsnorm(%partial, %residual, %w,
                                                                1e-06, 0.0, "0")
                            %out = getitem(%f, 0)      # the sum's other users read %f[1]
    """
    editor = handed_context(ctx, "fuse_allreduce_add_rmsnorm").editor
    sunk = [sink_below_views(*pair, editor) for pair in sum_all_reduces(gm)]
    return rewrite(gm, RULES, once=True, ctx=ctx).modified or any(sunk)
