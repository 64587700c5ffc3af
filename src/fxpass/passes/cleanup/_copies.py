"""When can a value be replaced by another that holds the same data? (shared by the passes
that drop views, copies and detaches)."""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

from ...edit.alias import AliasInfo
from ...fxutil.dialect import aten_op
from ...fxutil.values import node_val

__all__ = [
    "copy_is_unobservable",
    "input_becomes_output",
    "same_layout",
    "view_is_replaceable",
]


def same_layout(a: Any, b: Any) -> bool:
    """Do two example values have the same shape, dtype, device and strides?"""
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return False
    try:
        same = (a.shape, a.dtype, a.device) == (b.shape, b.dtype, b.device)
        return bool(same and (a.numel() <= 1 or a.stride() == b.stride()))
    except RuntimeError:  # sparse or otherwise stride-less tensors
        return False


def input_becomes_output(node: fx.Node, src: fx.Node) -> bool:
    """Would replacing ``node`` by ``src`` make a graph input a direct graph output?"""
    return src.op == "placeholder" and any(u.op == "output" for u in node.users)


def view_is_replaceable(node: fx.Node, src: fx.Node) -> bool:
    """May ``node`` — a view, alias or ``to`` of ``src`` with ``src``'s exact layout — be
    replaced by ``src``? Data writes through either reach the same memory, so yes, unless a
    user changes the view's metadata in place (``t_``, ``unsqueeze_``) or an input would
    become a graph output (backends reject that; see ``repair_input_as_output``)."""
    if not same_layout(node_val(node), node_val(src)) or input_becomes_output(node, src):
        return False
    for user in node.users:
        target = aten_op(user.target)
        if isinstance(target, torch._ops.OpOverload) and torch.Tag.inplace_view in target.tags:
            return False
    return True


def copy_is_unobservable(node: fx.Node, src: fx.Node, info: AliasInfo) -> bool:
    """May ``node`` — a fresh copy of ``src`` with the same layout — be replaced by ``src``?

    Only when nothing can tell the difference: no one writes the copy (or a view of it), no
    one writes ``src``'s memory while the copy is still read, and if the copy reaches the
    graph's output, ``src``'s memory is neither the caller's (an input, parameter, buffer)
    nor already returned by another output.
    """
    if not same_layout(node_val(node), node_val(src)):
        return False
    mine, theirs = frozenset({node}), info.roots(src)
    if info.written(mine):
        return False
    last = info.last_read(mine)
    if info.written(theirs, after=info.pos[node], before=last + 1):
        return False
    return not (info.escapes(mine) and (info.external(theirs) or info.escapes(theirs)))
