"""How a sharded value goes through each op: the layout of the result, and the constants
(reshape sizes, slice bounds, split sizes) a rank's graph must use instead of the global ones.

Each rule takes the propagation (:class:`~fxpass.distributed.propagate.Flow`: the layouts
of the inputs, their global shapes, and a way to record edits and divisibility
requirements) and the node, and returns the result's layout — or raises
:class:`~fxpass.distributed.placement.NotShardable` saying why the op cannot take a slice.
Ops are looked up as ATen ops, so Edge (``view_copy``...) and core ATen graphs share them.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from typing import Any

import torch
from torch import fx

from .placement import NotShardable, Shard, map_view

__all__ = ["RULES", "rule_for"]

aten = torch.ops.aten
Rule = Callable[[Any, fx.Node], Any]
RULES: dict[Any, Rule] = {}
_INT_MAX = 2**62


def _on(*ops: Any) -> Callable[[Rule], Rule]:
    def register(fn: Rule) -> Rule:
        for op in ops:
            RULES[op] = fn
        return fn

    return register


def _arg(node: fx.Node, i: int, name: str, default: Any = None) -> Any:
    if len(node.args) > i:
        return node.args[i]
    return node.kwargs.get(name, default)


def _where(node: fx.Node, i: int, name: str) -> tuple[str, Any]:
    """Where an argument lives, for :meth:`Flow.edit`: ("args", i) or ("kwargs", name)."""
    return ("args", i) if len(node.args) > i else ("kwargs", name)


def _norm(dim: int, rank: int) -> int:
    return dim + rank if dim < 0 else dim


def _tensors(node: fx.Node) -> list[fx.Node]:
    out = []
    for a in node.all_input_nodes:
        if isinstance(a.meta.get("val"), torch.Tensor):
            out.append(a)
    return out


def _sharded_input(flow: Any, node: fx.Node) -> Shard:
    shard = flow.layout(node.args[0])
    if not isinstance(shard, Shard):
        raise NotShardable(f"'{node.name}' reads a value whose layout is {shard!r}")
    return shard


# ----- elementwise -----------------------------------------------------------------------------
def pointwise(
    flow: Any, node: fx.Node, inputs: list[fx.Node] | None = None, out_rank: int | None = None
) -> Any:
    """Broadcasting elementwise ops: every sharded operand cut the same way; replicated
    operands must be broadcast (size 1, or absent) along the sharded dim."""
    if out_rank is None:
        out_rank = len(flow.shape(node))
    found: Shard | None = None
    replicated = []
    for a in inputs if inputs is not None else _tensors(node):
        lay = flow.layout(a)
        rank = len(flow.shape(a))
        if lay is None:
            replicated.append((a, rank))
            continue
        if not isinstance(lay, Shard):
            raise NotShardable(f"'{node.name}' reads '{a.name}', whose layout is {lay!r}")
        aligned = lay.moved(lay.dim + out_rank - rank)
        if found is not None and aligned != found:
            raise NotShardable(
                f"'{node.name}' combines values cut along different dims "
                f"({found.describe()} and {aligned.describe()})"
            )
        found = aligned
    if found is None:
        return None
    for a, rank in replicated:
        d = found.dim - (out_rank - rank)
        if d >= 0 and flow.shape(a)[d] != 1:  # a per-feature (per-head) weight: cut it too
            flow.companion(node, a, found.moved(d))
    return found


_IDENTITY = (
    aten.clone.default,
    aten.contiguous.default,
    aten.alias.default,
    aten.detach.default,
    aten._to_copy.default,
    aten.to.dtype,
    aten.to.dtype_layout,
    aten.to.device,
    aten.lift_fresh_copy.default,
    aten.empty_like.default,
    aten.zeros_like.default,
    aten.ones_like.default,
    aten.full_like.default,
    aten.rand_like.default,
    aten.randn_like.default,
)


@_on(*_IDENTITY)
def _identity(flow: Any, node: fx.Node) -> Any:
    return flow.layout(node.args[0])


@_on(aten.type_as.default)
def _type_as(flow: Any, node: fx.Node) -> Any:
    return pointwise(flow, node, [node.args[0]])


@_on(aten.dropout.default)
def _dropout(flow: Any, node: fx.Node) -> Any:
    if _arg(node, 2, "train", False) and _arg(node, 1, "p", 0.0):
        raise NotShardable(f"'{node.name}' is a training-mode dropout (its mask is random)")
    return flow.layout(node.args[0])


@_on(aten._assert_tensor_metadata.default)
def _assert(flow: Any, node: fx.Node) -> Any:
    if node.kwargs.get("size") is not None or node.kwargs.get("stride") is not None:
        raise NotShardable(f"'{node.name}' asserts the global size of a sharded value")
    return None


# ----- views -----------------------------------------------------------------------------------
def _view_like(flow: Any, node: fx.Node, size_arg: int | None) -> Shard:
    shard = _sharded_input(flow, node)
    before, after = flow.shape(node.args[0]), flow.shape(node)
    try:
        new, units, e = map_view(before, after, shard)
    except NotShardable as err:
        raise NotShardable(f"'{node.name}': {err}") from None
    width = math.prod(after[e + 1 :])
    flow.require(
        node, units, f"'{node.name}' cuts it into {units} slices of {width} (dim {e})", shard.ways
    )
    if size_arg is not None:
        sizes = list(node.args[size_arg])
        if sizes[e] != -1:
            sizes[e] = sizes[e] // flow.ways(new)
            flow.edit(node, ("args", size_arg), sizes)
    return new


@_on(aten.view.default, aten.reshape.default, aten._unsafe_view.default, aten.view_copy.default)
def _view(flow: Any, node: fx.Node) -> Any:
    return _view_like(flow, node, 1)


@_on(
    aten.unsqueeze.default,
    aten.unsqueeze_copy.default,
    aten.squeeze.dim,
    aten.squeeze.dims,
    aten.squeeze.default,
    aten.squeeze_copy.dim,
    aten.squeeze_copy.dims,
    aten.flatten.using_ints,
)
def _shapeless_view(flow: Any, node: fx.Node) -> Any:
    return _view_like(flow, node, None)


@_on(aten.permute.default, aten.permute_copy.default)
def _permute(flow: Any, node: fx.Node) -> Any:
    shard = _sharded_input(flow, node)
    rank = len(flow.shape(node))
    dims = [_norm(d, rank) for d in node.args[1]]
    return shard.moved(dims.index(shard.dim))


@_on(aten.transpose.int, aten.transpose_copy.int)
def _transpose(flow: Any, node: fx.Node) -> Any:
    shard = _sharded_input(flow, node)
    rank = len(flow.shape(node))
    a, b = (_norm(d, rank) for d in node.args[1:3])
    swap = {a: b, b: a}
    return shard.moved(swap.get(shard.dim, shard.dim))


@_on(aten.t.default, aten.t_copy.default)
def _t(flow: Any, node: fx.Node) -> Any:
    shard = _sharded_input(flow, node)
    return shard.moved(1 - shard.dim) if len(flow.shape(node)) == 2 else shard


@_on(aten.expand.default, aten.expand_copy.default)
def _expand(flow: Any, node: fx.Node) -> Any:
    shard = _sharded_input(flow, node)
    offset = len(flow.shape(node)) - len(flow.shape(node.args[0]))
    new = shard.moved(shard.dim + offset)
    sizes = list(node.args[1])
    if sizes[new.dim] != -1:
        sizes[new.dim] = sizes[new.dim] // flow.ways(new)
        flow.edit(node, ("args", 1), sizes)
    return new


@_on(aten.view_as_complex.default, aten.view_as_real.default)
def _complex(flow: Any, node: fx.Node) -> Any:
    """Rotary embeddings in complex numbers: pairs of the last dim become one number."""
    shard = _sharded_input(flow, node)
    if shard.dim >= len(flow.shape(node.args[0])) - 1:
        raise NotShardable(f"'{node.name}' pairs up the sharded last dim")
    return shard


@_on(aten.repeat_interleave.self_int)
def _repeat_interleave(flow: Any, node: fx.Node) -> Any:
    """GQA's key/value head repeat: repeating every head of a contiguous chunk of heads
    gives the matching contiguous chunk of the repeated heads."""
    shard = _sharded_input(flow, node)
    dim = _arg(node, 2, "dim", None)
    if dim is None or shard.outer != 1 or shard.parts:
        raise NotShardable(f"'{node.name}' repeats a sharded value without a plain dim")
    return shard


# ----- slicing, splitting, joining ----------------------------------------------------------
def _bounds(shard: Shard) -> list[tuple[int, int]]:
    out, start = [], 0
    for p in shard.parts:
        out.append((start, start + p))
        start += p
    return out


@_on(aten.slice.Tensor, aten.slice_copy.Tensor)
def _slice(flow: Any, node: fx.Node) -> Any:
    shard = _sharded_input(flow, node)
    shape = flow.shape(node.args[0])
    dim = _norm(_arg(node, 1, "dim", 0), len(shape))
    if dim != shard.dim:
        return shard
    size = shape[dim]
    start = _arg(node, 2, "start", 0) or 0
    end = min(_arg(node, 3, "end", None) or _INT_MAX, size)
    start = _norm(start, size)
    end = _norm(end, size)
    step = _arg(node, 4, "step", 1)
    if step == 1 and start == 0 and end == size:
        return shard
    if step > 1 and start < step and end == size and not shard.parts:
        # every step-th feature (gate/up interleaved): a rank's chunk, if a multiple of the
        # step, interleaves the same way
        what = f"'{node.name}' takes one in {step} of {size} features"
        flow.require(node, size // shard.outer // step, what, shard.ways)
        if (_arg(node, 3, "end", None) or _INT_MAX) < _INT_MAX:
            flow.edit(node, _where(node, 3, "end"), size // flow.ways(shard))
        return shard
    if step == 1 and shard.parts and (start, end) in _bounds(shard):
        n = flow.ways(shard)
        flow.edit(node, _where(node, 2, "start"), start // n)
        flow.edit(node, _where(node, 3, "end"), end // n)
        return Shard(dim, ways=shard.ways)
    raise NotShardable(
        f"'{node.name}' slices [{start}:{end}] of the sharded dim {dim}, which is not one "
        "part of a fused projection"
    )


def _pieces(flow: Any, node: fx.Node) -> list[int]:
    return [int(v.shape[_norm(_arg(node, 2, "dim", 0), v.dim())]) for v in node.meta["val"]]


@_on(aten.split.Tensor, aten.split_with_sizes.default, aten.split_copy.Tensor, aten.chunk.default)
def _split(flow: Any, node: fx.Node) -> Any:
    shard = _sharded_input(flow, node)
    shape = flow.shape(node.args[0])
    dim = _norm(_arg(node, 2, "dim", 0), len(shape))
    pieces = _pieces(flow, node)
    if dim != shard.dim:
        return [shard] * len(pieces)
    if not shard.parts or tuple(pieces) != shard.parts:
        raise NotShardable(
            f"'{node.name}' splits the sharded dim {dim} into {pieces}, which are not the "
            "parts of a fused projection"
        )
    n = flow.ways(shard)
    op = flow.op(node)
    if op in (aten.split_with_sizes.default,):
        flow.edit(node, ("args", 1), [p // n for p in pieces])
    elif op is not aten.chunk.default:
        flow.edit(node, ("args", 1), node.args[1] // n)
    return [Shard(dim, ways=shard.ways)] * len(pieces)


@_on(operator.getitem)
def _getitem(flow: Any, node: fx.Node) -> Any:
    lay = flow.layout(node.args[0])
    if isinstance(lay, (list, tuple)):
        return lay[node.args[1]]
    raise NotShardable(f"'{node.name}' indexes a value whose layout is {lay!r}")


@_on(aten.cat.default)
def _cat(flow: Any, node: fx.Node) -> Any:
    tensors = list(node.args[0])
    rank = len(flow.shape(node))
    dim = _norm(_arg(node, 1, "dim", 0), rank)
    shards = {flow.layout(t) for t in tensors} - {None}
    if len(shards) != 1:
        raise NotShardable(f"'{node.name}' joins values cut in different ways")
    (shard,) = shards
    if not isinstance(shard, Shard) or shard.dim == dim:
        raise NotShardable(f"'{node.name}' joins along the sharded dim {dim}")
    for t in tensors:  # attention sinks joined to the scores: cut with the heads
        if flow.layout(t) is None:
            flow.companion(node, t, shard)
    return shard


@_on(aten.stack.default)
def _stack(flow: Any, node: fx.Node) -> Any:
    """Interleaved rotary halves stacked on a new last dim: the shard moves past it."""
    tensors = list(node.args[0])
    lays = {flow.layout(t) for t in tensors}
    if len(lays) != 1 or not isinstance(next(iter(lays)), Shard):
        raise NotShardable(f"'{node.name}' stacks sharded and replicated values")
    (shard,) = lays
    dim = _norm(_arg(node, 1, "dim", 0), len(flow.shape(node)))
    return shard.moved(shard.dim + 1) if shard.dim >= dim else shard


# ----- reductions and normalizations along one dim -------------------------------------------
def _reduce(flow: Any, node: fx.Node, dims: Any, keepdim: bool) -> Any:
    shard = _sharded_input(flow, node)
    rank = len(flow.shape(node.args[0]))
    if dims is None or dims == []:
        dims = list(range(rank))
    dims = [dims] if isinstance(dims, int) else list(dims)
    dims = [_norm(d, rank) for d in dims]
    if shard.dim in dims:
        kind = _DISTRIBUTED.get(flow.op(node))
        if kind is None or flow.ways(shard) != flow.world_size:
            raise NotShardable(
                f"'{node.name}' ({flow.op(node)}) reduces over the sharded dim {shard.dim}"
            )
        # a distributed reduction: each rank reduces its slice, one small all-reduce
        # combines them (an RMSNorm's mean of squares over the whole projection)
        scale = 1.0 / flow.ways(shard) if flow.op(node) is aten.mean.dim else 1.0
        flow.reduce(node, kind, scale)
        return None
    if keepdim:
        return shard
    return shard.moved(shard.dim - sum(d < shard.dim for d in dims))


#: Reductions over the sharded dim that an all-reduce completes, and its op.
_DISTRIBUTED = {
    aten.mean.dim: "sum",
    aten.sum.dim_IntList: "sum",
    aten.amax.default: "max",
    aten.amin.default: "min",
}


@_on(aten.max.dim, aten.min.dim)
def _max_dim(flow: Any, node: fx.Node) -> Any:
    keep = _arg(node, 2, "keepdim", False)
    out = _reduce(flow, node, _arg(node, 1, "dim"), bool(keep))
    if out is None:
        raise NotShardable(f"'{node.name}' reduces over the sharded dim and returns indices")
    return [out, out]


@_on(aten.index.Tensor)
def _index(flow: Any, node: fx.Node) -> Any:
    """Rows gathered by replicated indices (an expert's bias by expert id): a value cut
    along a dim the indices do not touch stays cut, that dim moved past the indices'."""
    shard = _sharded_input(flow, node)
    indices = list(node.args[1])
    if any(flow.layout(i) is not None for i in indices if isinstance(i, fx.Node)):
        raise NotShardable(f"'{node.name}' gathers with sharded indices")
    if len(indices) != 1 or shard.dim == 0 or not isinstance(indices[0], fx.Node):
        raise NotShardable(f"'{node.name}' gathers along the sharded dim {shard.dim}")
    return shard.moved(shard.dim - 1 + len(flow.shape(indices[0])))


@_on(
    aten.mean.dim,
    aten.sum.dim_IntList,
    aten.amax.default,
    aten.amin.default,
    aten.any.dim,
    aten.any.dims,
    aten.logsumexp.default,
    aten.var.correction,
)
def _reduction(flow: Any, node: fx.Node) -> Any:
    if flow.op(node) is aten.var.correction:  # (x, dim, *, correction, keepdim)
        keep = node.kwargs.get("keepdim", False)
    else:
        keep = _arg(node, 2, "keepdim", False)
    return _reduce(flow, node, _arg(node, 1, "dim", None), bool(keep))


@_on(
    aten._softmax.default,
    aten.softmax.int,
    aten._log_softmax.default,
    aten.log_softmax.int,
    aten.cumsum.default,
)
def _along(flow: Any, node: fx.Node) -> Any:
    return _reduce(flow, node, _arg(node, 1, "dim"), True)


# ----- attention and batched matmuls -----------------------------------------------------------
def _heads(flow: Any, node: fx.Node, qkv: list[Any], mask: Any) -> Shard:
    lays = [flow.layout(t) for t in qkv]
    if any(not isinstance(lay, Shard) for lay in lays) or len(set(lays)) != 1:
        raise NotShardable(
            f"'{node.name}' needs query, key and value all cut along their heads, got "
            f"{[lay.describe() if isinstance(lay, Shard) else 'replicated' for lay in lays]}"
        )
    shard = lays[0]
    if shard.dim != 1 or shard.outer != 1 or shard.parts:
        raise NotShardable(f"'{node.name}' reads q/k/v cut along {shard.describe()}, not heads")
    if mask is not None:
        pointwise(flow, node, [qkv[0], mask], out_rank=len(flow.shape(qkv[0])))
    return shard


@_on(aten.scaled_dot_product_attention.default)
def _sdpa(flow: Any, node: fx.Node) -> Any:
    return _heads(flow, node, list(node.args[:3]), _arg(node, 3, "attn_mask"))


@_on(
    aten._scaled_dot_product_flash_attention_for_cpu.default,
    aten._scaled_dot_product_flash_attention.default,
    aten._scaled_dot_product_efficient_attention.default,
    aten._scaled_dot_product_cudnn_attention.default,
)
def _sdpa_impl(flow: Any, node: fx.Node) -> Any:
    mask = node.kwargs.get("attn_mask")
    if flow.op(node) in (
        aten._scaled_dot_product_efficient_attention.default,
        aten._scaled_dot_product_cudnn_attention.default,
    ):
        mask = node.args[3] if len(node.args) > 3 else node.kwargs.get("attn_bias", mask)
    shard = _heads(flow, node, list(node.args[:3]), mask)
    heads = flow.shape(node.args[0])[1]
    out = []
    for v in node.meta["val"]:
        per_head = isinstance(v, torch.Tensor) and v.dim() >= 2 and v.shape[1] == heads
        out.append(shard if per_head else None)
    return out


@_on(aten.bmm.default, aten.matmul.default)
def _batched_matmul(flow: Any, node: fx.Node) -> Any:
    a, b = node.args[:2]
    out_rank = len(flow.shape(node))
    for x in (a, b):
        lay, rank = flow.layout(x), len(flow.shape(x))
        if isinstance(lay, Shard) and lay.dim >= rank - 2:
            raise NotShardable(
                f"'{node.name}' multiplies along the sharded dim {lay.dim} of '{x.name}'"
            )
    if out_rank < 3:
        raise NotShardable(f"'{node.name}' has no batch dim to carry the shard")
    return pointwise(flow, node, [a, b])


def rule_for(op: Any) -> Rule | None:
    """The layout rule of ``op`` (an ATen op or ``operator.getitem``), or None."""
    rule = RULES.get(op)
    if rule is not None:
        return rule
    if isinstance(op, torch._ops.OpOverload) and torch.Tag.pointwise in op.tags:
        return pointwise
    return None
