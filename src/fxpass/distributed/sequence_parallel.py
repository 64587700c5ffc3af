"""``sequence_parallel``: reduce-scatter instead of all-reduce, so each rank normalizes only
its share of the tokens.

After tensor-parallel sharding, every rank holds the whole residual stream and runs every
norm on every token. Megatron-style sequence parallelism (vLLM's pass of the same name)
replaces each all-reduce with a reduce-scatter along the token dim: the residual adds, the
norms and the other token-wise ops then run on ``tokens / world_size`` rows, and the
activations they keep shrink by the world size. An all-gather brings the tokens back where
an op needs all of them — before the next column-parallel projection, attention, or the
graph's output. A reduce-scatter plus an all-gather move the same bytes as the all-reduce
they replace.

The pass follows the scattered values forward: element-wise ops, reductions over other
dims, casts and fxpass's fused norms keep them scattered (a replicated operand that spans
the tokens is sliced locally, with no communication); any other op gets the gathered
value, gathered once per value. It needs the rank (for those local slices) and the world
size; both default to torch.distributed's.

Before / after (one layer's end, rank 0 of 2, 8 tokens)::

    %ar = _c10d_functional.all_reduce(%partial, "sum", "0")      # [1, 8, 64]
    %h = _c10d_functional.wait_tensor(%ar)
    %sum = aten.add(%residual, %h)
    %normed = <RMSNorm of %sum>
    %q = aten.linear(%normed, %wq)
                        ->
    %rs = _c10d_functional.reduce_scatter_tensor(%partial', "sum", 2, "0")   # [4, 64]
    %h = aten.view(_c10d_functional.wait_tensor(%rs), [1, 4, 64])
    %sum = aten.add(%residual, %h)                                 # [1, 4, 64]
    %normed = <RMSNorm of %sum>                                    # 4 tokens, not 8
    %full = <all_gather(%normed) along dim 1>                      # [1, 8, 64]
    %q = aten.linear(%full, %wq)
"""

from __future__ import annotations

import heapq
import operator
from collections.abc import Callable
from typing import Any

import torch
from torch import fx

from ..core.context import PassContext
from ..core.pass_registry import REGISTRY
from ..edit.editor import Editor
from ..fxutil.fx_internals import sort_key
from ..rewrite.metadata import fake_mode, repropagate
from . import collectives
from .collectives import Inserter
from .placement import NotShardable, Shard
from .plan import ShardError
from .rules import RULES
from .sites import target_of
from .strategy import handed_context
from .tensor_parallel import rank_key, resolve_rank

__all__ = ["sequence_parallel"]

aten = torch.ops.aten
fxpass_ops = torch.ops.fxpass

_ROWWISE = {  # ops that treat each token on its own (besides the pointwise ones)
    aten.clone.default,
    aten.alias.default,
    aten._to_copy.default,
    aten.to.dtype,
    aten.to.dtype_layout,
    aten.type_as.default,
    aten.dropout.default,
    aten._assert_tensor_metadata.default,
    aten.mean.dim,
    aten.sum.dim_IntList,
    aten.amax.default,
    aten.var.correction,
    operator.getitem,
}
RULE = "sequence_parallel"
_RMS_NORM = fxpass_ops.rms_norm.default
_NORMS = {
    fxpass_ops.rms_norm.default,
    fxpass_ops.fused_add_rmsnorm.default,
    fxpass_ops.fused_add_rmsnorm_quant.default,
}


_Stat = Callable[..., None]  # (name, value=1)


def _no_stat(name: str, value: float = 1) -> None:
    """Counts nothing: scatter_graph called outside a pass."""


def _is_tensor(node: fx.Node) -> bool:
    return isinstance(node.meta.get("val"), torch.Tensor)


def _token_dim(shape: tuple[int, ...], world_size: int, where: str) -> int:
    for d, size in enumerate(shape[:-1]):
        if size > 1 and size % world_size == 0:
            return d
    raise ShardError(
        f"sequence parallelism cannot split the tokens of '{where}' (shape {list(shape)}) "
        f"across {world_size} ranks: no token dim is a multiple of {world_size}"
    )


class _Scatter:
    """Follow the scattered values; slice replicated operands, gather where needed."""

    def __init__(self, editor: Editor, rank: int, world_size: int, group: str, stat: _Stat) -> None:
        self.editor, self.rank, self.n, self.group = editor, rank, world_size, group
        self.stat = stat
        self.layouts: dict[fx.Node, Any] = {}
        self.gathered: dict[fx.Node, fx.Node] = {}
        self.sliced: dict[tuple[fx.Node, int], fx.Node] = {}
        self.world_size = world_size  # what the layout rules read

    # what the layout rules ask of a flow
    def layout(self, arg: Any) -> Any:
        return self.layouts.get(arg) if isinstance(arg, fx.Node) else None

    def shape(self, node: fx.Node) -> tuple[int, ...]:
        return tuple(int(s) for s in node.meta["val"].shape)

    def op(self, node: fx.Node) -> Any:
        return target_of(node)

    def ways(self, shard: Shard) -> int:
        return shard.ways or self.n

    def reduce(self, node: fx.Node, op: str, scale: float = 1.0) -> None:
        raise NotShardable(f"'{node.name}' reduces over the scattered tokens")

    def run(self, seeds: dict[fx.Node, Shard]) -> None:
        self.layouts.update(seeds)
        heap = [(sort_key(u), u.name, u) for s in seeds for u in s.users]
        heapq.heapify(heap)
        seen = {n for *_, n in heap}
        while heap:
            *_, node = heapq.heappop(heap)
            layout = self._visit(node)
            if layout is None:
                continue
            self.layouts[node] = layout
            for u in node.users:
                if u not in seen:
                    seen.add(u)
                    heapq.heappush(heap, (sort_key(u), u.name, u))

    def _visit(self, node: fx.Node) -> Any:
        op = target_of(node) if node.op == "call_function" else None
        try:
            if op in _NORMS:
                shard = self._agree(node, list(node.args[: 1 if op is _RMS_NORM else 2]))
                if shard.dim == len(self.shape(node.args[0])) - 1:
                    raise NotShardable("the norm is over the scattered dim")
                return shard if op is _RMS_NORM else [shard, shard]
            if op in RULES and op in _ROWWISE:
                return RULES[op](self, node)
            if isinstance(op, torch._ops.OpOverload) and torch.Tag.pointwise in op.tags:
                tensors = [a for a in node.all_input_nodes if _is_tensor(a)]
                return self._agree(node, tensors)
        except NotShardable:
            pass
        self._gather_inputs(node)
        return None

    def _agree(self, node: fx.Node, inputs: list[fx.Node]) -> Shard:
        """The common layout of ``inputs`` (aligned to ``node``'s rank, the first input's
        for norms); replicated inputs that span the tokens are sliced to this rank's."""
        out_rank = len(self.shape(inputs[0])) if target_of(node) in _NORMS else None
        out_rank = out_rank or len(self.shape(node))
        found, spanning = None, []
        for a in inputs:
            lay, offset = self.layout(a), out_rank - len(self.shape(a))
            if isinstance(lay, Shard):
                aligned = lay.moved(lay.dim + offset)
                if found not in (None, aligned):
                    raise NotShardable(f"'{node.name}' mixes scattered dims")
                found = aligned
            elif lay is not None:
                raise NotShardable(f"'{node.name}' reads {lay!r}")
            else:
                spanning.append((a, offset))
        if found is None:
            raise NotShardable(f"'{node.name}' reads nothing scattered")
        for a, offset in spanning:
            d = found.dim - offset
            if d >= 0 and self.shape(a)[d] != 1:
                self.editor.replace_input(node, a, self._slice(a, d), rule=RULE)
        return found

    def _slice(self, value: fx.Node, dim: int) -> fx.Node:
        key = (value, dim)
        if key not in self.sliced:
            size = self.shape(value)[dim] // self.n
            put = Inserter(self.editor, RULE, [value], after=value)
            start = self.rank * size
            piece = put(aten.slice.Tensor, value, dim, start, start + size)
            piece.meta["val"] = value.meta["val"]  # global until repropagated, like the rest
            self.layouts[piece] = Shard(dim)
            self.sliced[key] = piece
            self.stat("slices")
        return self.sliced[key]

    def _gather_inputs(self, node: fx.Node) -> None:
        for a in node.all_input_nodes:
            lay = self.layouts.get(a)
            if isinstance(lay, Shard):
                self.editor.replace_input(node, a, self._gather(a, lay), rule=RULE)

    def _gather(self, value: fx.Node, shard: Shard) -> fx.Node:
        if value not in self.gathered:
            local = list(self.shape(value))
            local[shard.dim] //= self.n
            put = Inserter(self.editor, RULE, [value], after=value)
            full = collectives.all_gather(put, value, local, shard.dim, self.n, self.group)
            self.gathered[value] = full
            self.stat("all_gathers")
        return self.gathered[value]


def _per_token(value: fx.Node) -> bool:
    val = value.meta.get("val")
    return isinstance(val, torch.Tensor) and val.dim() >= 2 and val.shape[-1] == 1


def scatter_graph(
    gm: fx.GraphModule, rank: int, world_size: int, editor: Editor, stat: _Stat = _no_stat
) -> int:
    """Turn the graph's sum all-reduces into reduce-scatters (see the module docstring),
    editing through ``editor`` and counting slices and all-gathers with ``stat`` (a
    :meth:`PassContext.stat <fxpass.core.PassContext.stat>`); returns how many."""
    # a distributed norm's all-reduce (one value per token, [..., 1]) stays: its result
    # scales feature-sharded values of every token, which the scattered layout cannot hold
    pairs = [(r, w) for r, w in collectives.sum_all_reduces(gm) if not _per_token(r.args[0])]
    if not pairs:
        return 0
    seeds: dict[fx.Node, Shard] = {}
    scatter = _Scatter(editor, rank, world_size, pairs[0][0].args[2], stat)
    for reduce, wait in pairs:
        collectives.sink_below_views(reduce, wait, editor)
        if not editor.allow():
            continue
        value = reduce.args[0]
        full = tuple(int(s) for s in value.meta["val"].shape)
        dim = _token_dim(full, world_size, value.name)
        put = Inserter(editor, RULE, [reduce], after=wait)
        local = collectives.reduce_scatter(put, value, full, dim, world_size, reduce.args[2])
        editor.replace_all_uses(wait, local, RULE)
        editor.erase(reduce, RULE)
        local.meta["val"] = value.meta["val"]  # the global value while the walk runs
        seeds[local] = Shard(dim)
    scatter.run(seeds)
    for node in scatter.layouts:  # now local: recomputed (with what they feed) afterwards
        node.meta.pop("val", None)
    return len(seeds)


@REGISTRY.register(
    "sequence_parallel",
    origin="fxpass",
    keeps=("val", "stack_trace", "nn_module_stack", "provenance"),
    statistics={
        "reduce_scatters": "all-reduces turned into reduce-scatters",
        "all_gathers": "all-gathers inserted where all tokens are needed",
        "slices": "replicated values sliced to this rank's tokens",
    },
)
def sequence_parallel(
    gm: fx.GraphModule, *, world_size: int = 0, rank: int = -1, ctx: PassContext | None = None
) -> bool:
    """Replace each sum all-reduce by a reduce-scatter over the tokens, run the token-wise
    ops (residual adds, norms) on this rank's tokens, and all-gather where all tokens are
    needed (see :mod:`fxpass.distributed.sequence_parallel`)."""
    world_size, rank = resolve_rank(world_size, rank)
    if world_size == 1:
        return False
    ctx = handed_context(ctx, RULE)
    count = scatter_graph(gm, rank, world_size, ctx.editor, ctx.stat)
    if not count:
        return False
    repropagate(gm, fake_mode(gm))
    gm.graph.lint()
    ctx.stat("reduce_scatters", count)
    return True


sequence_parallel.cache_key = rank_key
