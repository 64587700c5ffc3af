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
from torch._guards import detect_fake_mode
from torch.fx import Node, Proxy
from torch.fx.experimental.symbolic_shapes import statically_known_true, sym_eq

from ...fxutil.layout import memory_order, same_layout
from ...rewrite.constraint import value_of

aten = torch.ops.aten

__all__ = ["fake_result", "keep_layout"]


def _node(v: Any) -> Any:
    return v.node if isinstance(v, Proxy) else v


def _meta_key(v: Any) -> Any:
    if isinstance(v, torch.Tensor):  # a symbolic size makes the key unhashable
        return (v.shape, v.stride(), v.dtype, getattr(v, "fake_device", None) or v.device)
    return v


def _fake_mode(vals: list[Any]) -> Any:
    for v in vals:
        mode = getattr(v, "fake_mode", None)
        if mode is not None:
            return mode
    return detect_fake_mode([v for v in vals if isinstance(v, torch.Tensor)])


def _layout_only(value: Any) -> Any:
    """``value`` with its tensors as meta tensors of the same sizes, strides and dtype (no
    fake mode kept alive by a cache); raises TypeError for symbolic sizes."""
    if isinstance(value, torch.Tensor):
        if not all(type(s) is int for s in (*value.shape, *value.stride())):
            raise TypeError("symbolic sizes")
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")
    if isinstance(value, (tuple, list)):
        return type(value)(_layout_only(v) for v in value)
    return value


# Layer-stacked models fuse ops on the same shapes hundreds of times, and the layout of a
# fused op's result depends only on its inputs' metadata: one result per metadata.
_RESULTS: dict[Any, tuple[Any, Any]] = {}


def fake_result(op: Any, *args: Any) -> Any:
    """What ``op``'s fake kernel returns on the fake values of ``args`` (nodes or proxies;
    other arguments as they are) — sizes, strides and dtypes, for comparing layouts: a
    result may be a meta tensor shared with other calls; None where a value is missing or
    the kernel raises."""
    vals = [value_of(_node(a)) if isinstance(_node(a), Node) else a for a in args]
    try:
        key: Any = (id(op), *(_meta_key(v) for v in vals))
        hit = _RESULTS.get(key)
    except TypeError:  # symbolic sizes: evaluate every time
        key = hit = None
    if hit is not None and hit[0] is op:
        return hit[1]
    mode = _fake_mode(vals)
    if mode is None:
        return None
    try:
        with mode:
            out = op(*vals)
    except Exception:
        return None
    if key is not None:
        try:
            out = _layout_only(out)
        except TypeError:
            return out
        if len(_RESULTS) > 1024:
            _RESULTS.clear()
        _RESULTS[key] = (op, out)  # the op keeps its id valid
    return out


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
