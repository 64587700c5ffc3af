"""Fused replacements keep the layouts that the replaced nodes' users were traced against.

A fused op lays its results out by its own rule (see docs/ops.md); the chain of ATen ops it
replaces may have produced another layout — an upcast of a sliced input makes a contiguous
copy, for one — and every node downstream (a ``view`` above all) was traced against that
layout. So a replacement does not assume: it runs the fused op's fake kernel on the inputs'
values and compares each result with the value it replaces. Where they differ it restores
the old layout with a copy (``permute → clone → permute`` back: the values of the old node
exactly, in its dense layout); where the old layout is not dense, or not known (symbolic
strides), it declines the match and the site stays unfused.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.fx import Node, Proxy
from torch.fx.experimental.symbolic_shapes import statically_known_true, sym_eq

from ...fxutil.layout import memory_order, same_layout
from ...fxutil.values import FakeEvaluator, Strictness
from ...rewrite.constraint import value_of

aten = torch.ops.aten

__all__ = ["call", "fake_result", "keep_layout"]


def _node(v: Any) -> Any:
    return v.node if isinstance(v, Proxy) else v


#: A fused op's fake kernel that cannot run on a site's values declines the site (the
#: failure is kept in ``failures`` and logged), it does not fail the pass.
_FAKE = FakeEvaluator(strictness=Strictness.LENIENT, new_mode=False, owner="fusion")


def call(op: Any, *args: Any) -> Any:
    """``op(*args)`` in a replacement: where an argument is a proxy, the node is made by its
    tracer straight away — what ``op``'s dispatch to ``Proxy.__torch_function__`` ends in,
    without torch's dispatch (a few percent of a fused rewrite)."""
    for a in args:
        if isinstance(a, Proxy):
            return a.tracer.create_proxy("call_function", op, args, {})
    return op(*args)


def fake_result(op: Any, *args: Any) -> Any:
    """The layout of ``op``'s result on the fake values of ``args`` (nodes or proxies; other
    arguments as they are): tensors with its sizes, strides and dtype (fake, or meta when
    an earlier site had the same inputs); None where a value is missing or the kernel
    raises."""
    vals = [value_of(_node(a)) if isinstance(_node(a), Node) else a for a in args]
    if not any(isinstance(v, torch.Tensor) for v in vals):
        return None
    return _FAKE.run(op, tuple(vals), layout_only=True)


def keep_layout(new: Any, new_val: Any, old: Any) -> Any:
    """``new`` (a proxy whose fake value is ``new_val``) as the value that replaces ``old``:
    itself where the layouts agree, a copy in ``old``'s layout where that is dense, else
    None (decline)."""
    old_val = value_of(_node(old))
    if not isinstance(new_val, torch.Tensor) or not isinstance(old_val, torch.Tensor):
        return None
    if new_val.dtype != old_val.dtype:
        return None
    static = not (new_val._has_symbolic_sizes_strides or old_val._has_symbolic_sizes_strides)
    if static:  # plain sizes compare without the symbolic machinery (nothing to guard)
        same_shape = new_val.shape == old_val.shape
        if same_shape and new_val.stride() == old_val.stride():
            return new
    else:
        same_shape = new_val.dim() == old_val.dim() and statically_known_true(
            sym_eq(tuple(new_val.shape), tuple(old_val.shape))
        )
    if not same_shape:
        # The pattern saw through row-keeping views in front of the norm, and the rewriter
        # replays them on the result: views of a value laid out like the chain's input (the
        # elementwise rule) are laid out like the values they replace. Where the sizes are
        # symbolic (no guard is added) or the element counts differ, decline.
        if new_val.numel() is old_val.numel() or statically_known_true(
            sym_eq(new_val.numel(), old_val.numel())
        ):
            return new
        return None
    if same_layout(new_val, old_val):
        return new
    order = memory_order(old_val)
    if order is None:
        return None
    inverse = sorted(range(len(order)), key=order.__getitem__)
    dense = aten.clone.default(
        aten.permute.default(new, order), memory_format=torch.contiguous_format
    )
    return aten.permute.default(dense, inverse)
