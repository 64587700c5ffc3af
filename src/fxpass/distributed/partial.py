"""How partial sums go through ops: the ops linear in them keep them partial.

A value is *partial* (:data:`~fxpass.distributed.placement.PARTIAL`) when its full value is
the sum over the ranks of what each holds: the output of a grouped (expert) matmul cut
along its input features, or of the experts one rank owns. Such a value need not be
all-reduced right away: a reshape, a gather of rows, a sum over the top-k experts, a
product with a replicated routing weight or a cast to a wider type of a sum is the sum of
the same op on each rank's part. Reducing after them moves fewer bytes (a token's
``hidden`` values instead of ``top_k x hidden``) and keeps one all-reduce for the expert
parallel and the tensor-parallel parts of the same experts. A bias added to partial sums
is added on one rank only. Any other op needs the full value: the flow all-reduces the
partial sums it reads right before it.

>>> partial_rule(flow, view_node)          # PARTIAL: a view of a sum is the sum of views  # doctest: +SKIP
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch import fx

from .placement import PARTIAL
from .sites import SAME_VALUE, target_of

__all__ = ["LINEAR", "WEIGHT_CHAIN", "from_weight", "partial_rule"]

aten = torch.ops.aten

#: Ops a weight may pass through and still count as read from that weight (casts, views,
#: expands, gathers of rows): a companion weight's way to the op that meets a shard.
WEIGHT_CHAIN = SAME_VALUE | {
    aten.expand.default,
    aten.index.Tensor,
    aten._assert_tensor_metadata.default,
}

#: Ops of one tensor that are linear in it (views, copies, slices, sums).
LINEAR = {
    aten.view.default,
    aten.reshape.default,
    aten._unsafe_view.default,
    aten.view_copy.default,
    aten.unsqueeze.default,
    aten.squeeze.dim,
    aten.squeeze.dims,
    aten.squeeze.default,
    aten.flatten.using_ints,
    aten.permute.default,
    aten.transpose.int,
    aten.t.default,
    aten.clone.default,
    aten.contiguous.default,
    aten.alias.default,
    aten.detach.default,
    aten.slice.Tensor,
    aten.select.int,
    aten.neg.default,
    aten.sum.dim_IntList,
    aten.sum.default,
    aten.mean.dim,
    aten.index.Tensor,
    aten.index_select.default,
}
_SPLITS = {aten.split.Tensor, aten.split_with_sizes.default, aten.chunk.default, aten.unbind.int}
_CASTS = {aten._to_copy.default, aten.to.dtype, aten.to.dtype_layout}
_SCALE = {aten.mul.Tensor, aten.div.Tensor}
_ADD = {aten.add.Tensor, aten.add_.Tensor, aten.sub.Tensor}


def _val(node: Any) -> Any:
    return node.meta.get("val") if isinstance(node, fx.Node) else None


def _widening(node: fx.Node) -> bool:
    src, out = _val(node.args[0]), _val(node)
    if not isinstance(src, torch.Tensor) or not isinstance(out, torch.Tensor):
        return False
    if not (src.dtype.is_floating_point and out.dtype.is_floating_point):
        return False
    return out.dtype.itemsize >= src.dtype.itemsize and out.device == src.device


def from_weight(params: Any, node: Any) -> bool:
    """Whether ``node`` is a weight, or read from one through :data:`WEIGHT_CHAIN` ops."""
    while isinstance(node, fx.Node):
        if params is not None and params.is_weight(node):
            return True
        if node.op != "call_function" or target_of(node) not in WEIGHT_CHAIN:
            return False
        node = node.args[0]
    return False


def partial_rule(flow: Any, node: fx.Node) -> Any:
    """The layout of ``node``'s result when it is linear in the partial sums it reads
    (:data:`PARTIAL`, or a list for ops with several results), else None."""
    op = target_of(node)
    parts = [a for a in node.all_input_nodes if flow.layout(a) is PARTIAL]
    first = node.args[0] if node.args else None
    others = [a for a in node.all_input_nodes if a not in parts]
    if any(flow.layout(a) is not None for a in others):
        return None  # partial sums meeting a sharded value
    if op in LINEAR and parts == [first]:
        return PARTIAL
    if op in _SPLITS and parts == [first]:
        return [PARTIAL] * len(_val(node))
    if op is operator.getitem:
        lay = flow.layouts.get(first)
        return lay[node.args[1]] if isinstance(lay, list) else None
    if op in _CASTS and parts == [first] and _widening(node):
        return PARTIAL
    if op in _SCALE and len(parts) == 1 and (op is aten.mul.Tensor or parts[0] is first):
        return PARTIAL
    if op in _ADD and len(node.all_input_nodes) == 2:
        if len(parts) == 2:
            return PARTIAL
        if parts == [first] and from_weight(flow.params, others[0]):
            flow.rank0_adds.append(node)  # a bias: one rank adds it
            return PARTIAL
    return None
