"""Find the mixtures of experts of a graph, without its model source.

A *block* starts at a router's ``topk`` over ``E`` scores: its indices are the expert ids.
Its experts are stored one of two ways.

*Stacked*: the block's *expert tensors* are the weights whose first dim is ``E`` and that the graph only reads
by expert — as the stack of a grouped matmul (``grouped_mm(x, W[E, in, out], offsets)``,
offsets counted from the sorted ids), or gathered row by row with the ids
(``W[ids]``: batched expert matmuls, expert biases). Each result of such a read has one
row per routed (token, expert) pair, in the order of the ids it was read with; the rows
go on through row-wise ops (activations, gate products, the next grouped matmul, a
product with the routing weight) until an op mixes rows (putting them back in token order,
the sum over the top-k): there the rows *exit*.

Split across expert groups, each rank keeps its experts' tensors and rotates the ids so
its experts come first (``(id - first) mod E``: sorting puts its rows first, the grouped
matmul runs its experts on them and leaves the rest zero), clamps the ids it gathers
with, and zeroes at each exit the rows of experts it does not own. What exits is then a
partial sum, all-reduced where the flow needs its full value (:mod:`.partial`).

*Separate linears* (a list of expert MLPs, each run on every token and weighted by a gate
taken from the router's top-k): the block's experts are the ``E`` MLPs whose outputs are
multiplied by such a gate. Split across ranks, each keeps its experts' MLPs, the others'
outputs become zeros (their weights leave the program), and the weighted sum is a partial
sum as above.

Where a block cannot be split, :func:`find_blocks` says why (a read of an expert tensor
that is not by expert, offsets not counted from the ids, rows in two orders).
"""

from __future__ import annotations

import heapq
import operator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx

from ..fxutil.fx_internals import sort_key
from .partial import WEIGHT_CHAIN
from .plan import ExpertBlock
from .sites import SAME_VALUE, Params, is_grouped_mm, target_of

__all__ = ["Block", "find_blocks"]

aten = torch.ops.aten

_SAME_IDS = SAME_VALUE  # (casts for histc included)
_TRANSPOSE = {aten.transpose.int, aten.permute.default, aten.t.default}
_ROW_COPIES = {aten.clone.default, aten.contiguous.default, aten.alias.default,
               aten._to_copy.default, aten.to.dtype, aten.to.dtype_layout,
               aten.detach.default}  # fmt: skip
_ROW_SLICES = {aten.slice.Tensor, aten.select.int, aten.split.Tensor,
               aten.split_with_sizes.default, aten.chunk.default}  # fmt: skip
_ROW_VIEWS = {aten.view.default, aten.reshape.default, aten._unsafe_view.default,
              aten.unsqueeze.default, aten.squeeze.dim}  # fmt: skip


def _val(node: Any) -> Any:
    return node.meta.get("val") if isinstance(node, fx.Node) else None


def _arg(node: fx.Node, i: int, name: str, default: Any = None) -> Any:
    return node.args[i] if len(node.args) > i else node.kwargs.get(name, default)


@dataclass
class Block:
    """One mixture of experts, found on a graph (nodes, not names)."""

    router: fx.Node  # the topk
    ids: fx.Node  # getitem(topk, 1)
    experts: int
    tensors: list[fx.Node] = field(default_factory=list)  # expert weights (placeholders)
    grouped: list[fx.Node] = field(default_factory=list)  # grouped matmuls (offsets sliced)
    gathers: list[fx.Node] = field(default_factory=list)  # W[ids] reads (ids clamped)
    exits: list[tuple[fx.Node, fx.Node]] = field(default_factory=list)  # (rows, their ids)
    candidates: list[fx.Node] = field(default_factory=list)
    routed: list[fx.Node] = field(default_factory=list)  # readers of ids that reach experts
    mlps: list[tuple[fx.Node, list[fx.Node]]] = field(default_factory=list)  # (output, body)

    def combine_cost(self, ranks: int) -> dict[str, int]:
        """Bytes each rank sends per forward to combine the experts' outputs: an all-reduce
        of the tokens' ``hidden`` values (ring: ``2·(N-1)/N`` of them), against an all-to-all
        that sends each routed (token, expert) row to its expert's rank and back and then
        all-gathers the tokens for the tensor-parallel layers after it."""
        scores = _val(self.router.args[0])
        k = int(_arg(self.router, 1, "k"))
        tokens = int(scores.numel() // scores.shape[-1])
        out = _val(self.exits[0][0]) if self.exits else None
        hidden = int(out.shape[-1]) if isinstance(out, torch.Tensor) else 0
        size = out.element_size() if isinstance(out, torch.Tensor) else 0
        share = (ranks - 1) / ranks
        row = tokens * hidden * size
        return {
            "all_reduce": int(2 * share * row),
            "all_to_all": int(2 * share * row * k + share * row),
        }

    def describe(self, params: Params, ranks: int = 2) -> ExpertBlock:
        names = [params.name(t) for t in self.tensors]
        reads = (f"{len(self.grouped)} grouped matmul" + "s" * (len(self.grouped) != 1)) + (
            f", {len(self.gathers)} gathers by id" if self.gathers else ""
        )
        if self.mlps:
            reads = "separate linears, split whole across the stage's ranks"
        cost = self.combine_cost(ranks)
        reason = (
            f"{self.experts} experts chosen by '{self.router.name}' ({reads}); rows leave at "
            f"{', '.join(repr(v.name) for v, _ in self.exits)}; combined by all-reduce: "
            f"{cost['all_reduce']:,} bytes per rank, against {cost['all_to_all']:,} for an "
            "all-to-all dispatch and combine (every rank already holds every token)"
        )
        return ExpertBlock(self.router.name, self.experts, names,
                           [v.name for v, _ in self.exits], reason)  # fmt: skip


class NotExperts(Exception):
    """A router's block cannot be split across expert groups; ``str()`` says why."""


def _id_values(ids: fx.Node) -> set[fx.Node]:
    """The values that are expert ids: ``ids`` and its reshapes, casts and sorted values."""
    out, todo = {ids}, [ids]
    while todo:
        node = todo.pop()
        for user in node.users:
            op = target_of(user) if user.op == "call_function" else None
            keep = op in _SAME_IDS
            if op is operator.getitem and target_of(node) is aten.sort.default:
                keep = user.args[1] == 0  # the sorted ids (not the permutation)
            if op is aten.sort.default:
                keep = True
            if keep and user not in out:
                out.add(user)
                todo.append(user)
    return {n for n in out if target_of(n) is not aten.sort.default}


def _stack_of(node: Any, params: Params, experts: int) -> fx.Node | None:
    """The expert tensor ``node`` reads (through casts and transposes), or None."""
    while isinstance(node, fx.Node) and node.op == "call_function":
        if target_of(node) not in (WEIGHT_CHAIN | _TRANSPOSE) - {aten.index.Tensor}:
            return None
        node = node.args[0]
    val = _val(node)
    if params.is_weight(node) and isinstance(val, torch.Tensor) and val.dim() >= 2:
        return node if val.shape[0] == experts else None
    return None


def _offsets_ids(offs: Any) -> fx.Node | None:
    """The node the offsets of a grouped matmul were counted from (``cumsum(histc(ids))``
    or ``cumsum(bincount(ids))``, through casts), or None."""
    node, counted = offs, False
    while isinstance(node, fx.Node) and node.op == "call_function":
        op = target_of(node)
        if op in (aten.histc.default, aten.bincount.default):
            counted = True
        elif op not in _SAME_IDS | {aten.cumsum.default}:
            return node if counted else None
        node = node.args[0]
    return node if counted else None


def _reads(tensor: fx.Node, params: Params, experts: int) -> list[tuple[str, fx.Node, Any]]:
    """Every read of an expert tensor: ``(kind, node, ids)`` with kind ``"grouped"``,
    ``"gather"`` or ``"whole"`` (not by expert; ids None)."""
    out: list[tuple[str, fx.Node, Any]] = []
    todo = list(tensor.users)
    while todo:
        user = todo.pop()
        op = target_of(user)
        if is_grouped_mm(op) and _stack_of(user.args[1], params, experts) is tensor:
            out.append(("grouped", user, _offsets_ids(_arg(user, 2, "offs"))))
        elif op is aten.index.Tensor and _stack_of(user.args[0], params, experts) is tensor:
            index = list(user.args[1])
            out.append(("gather", user, index[0] if len(index) == 1 else None))
        elif op in (WEIGHT_CHAIN | _TRANSPOSE) - {aten.index.Tensor}:
            todo += list(user.users)
        else:
            out.append(("whole", user, None))
    return out


def _collect(block: Block, params: Params, ids: set[fx.Node]) -> dict[fx.Node, fx.Node]:
    """The block's expert tensors and their reads: result node -> the ids its rows follow.
    A tensor whose reads all follow another router's ids belongs to another block."""
    rows: dict[fx.Node, fx.Node] = {}
    for tensor in block.candidates:
        reads = _reads(tensor, params, block.experts)
        mine = [r for r in reads if r[2] in ids]
        if not mine:
            continue
        for kind, node, by in reads:
            if by not in ids:
                what = "whole" if kind == "whole" else "by something else than the expert ids"
                raise NotExperts(f"'{node.name}' ({target_of(node)}) reads the expert tensor "
                                 f"'{params.name(tensor)}' {what}")  # fmt: skip
            rows[node] = by
            (block.grouped if kind == "grouped" else block.gathers).append(node)
        block.tensors.append(tensor)
    return rows


def _row_wise(node: fx.Node, value: fx.Node, rows: int) -> bool:
    """Whether ``node`` treats each row of ``value`` (``rows`` of them) on its own."""
    op = target_of(node)
    out = _val(node)
    if op is operator.getitem or op is aten._assert_tensor_metadata.default:
        return True
    if is_grouped_mm(op):
        return node.args[0] is value
    if isinstance(op, torch._ops.OpOverload) and torch.Tag.pointwise in op.tags:
        return True
    if op in _ROW_COPIES:
        return True
    if op in _ROW_SLICES:
        dim = _arg(node, 1 if op in (aten.slice.Tensor, aten.select.int) else 2, "dim", 0)
        return dim not in (0, -_val(value).dim())
    if op in _ROW_VIEWS:
        vals = out if isinstance(out, (list, tuple)) else [out]
        return all(isinstance(v, torch.Tensor) and v.dim() and v.shape[0] == rows for v in vals)
    return False


def _exits(rows: dict[fx.Node, fx.Node]) -> list[tuple[fx.Node, fx.Node]]:
    """Follow the rows from the reads to where they leave; (value, ids) at each exit."""
    order = dict(rows)
    heap = [(sort_key(n), n.name, n) for n in rows]
    heapq.heapify(heap)
    exits: dict[fx.Node, fx.Node] = {}
    while heap:
        *_, node = heapq.heappop(heap)
        ids = order[node]
        val = _val(node)
        count = _val(ids).numel()
        for user in node.users:
            if user.op == "call_function" and _row_wise(user, node, count):
                known = order.get(user)
                if known is not None and known is not ids:
                    raise NotExperts(f"'{user.name}' combines rows ordered by '{known.name}' "
                                     f"and by '{ids.name}'")  # fmt: skip
                if known is None:
                    order[user] = ids
                    heapq.heappush(heap, (sort_key(user), user.name, user))
            elif isinstance(val, torch.Tensor):
                exits[node] = ids
            else:
                raise NotExperts(f"the rows of '{node.name}' leave the experts unmasked")
    return sorted(exits.items(), key=lambda e: sort_key(e[0]))


def _block(router: fx.Node, params: Params) -> Block | None:
    scores = _val(router.args[0])
    dim = _arg(router, 2, "dim", -1)
    if not isinstance(scores, torch.Tensor) or dim not in (-1, scores.dim() - 1):
        return None
    experts = int(scores.shape[-1])
    k = _arg(router, 1, "k")
    ids = next((u for u in router.users if u.target is operator.getitem and u.args[1] == 1), None)
    if ids is None or not isinstance(k, int) or not 1 <= k < experts:
        return None
    values = _id_values(ids)
    block = Block(router, ids, experts)
    for node in router.graph.nodes:
        stack = node.op in ("placeholder", "get_attr") and _stack_of(node, params, experts)
        if stack is node and not any(target_of(u) is aten.linear.default for u in node.users):
            block.candidates.append(node)  # ([E, hidden] router weights are linear sites)
    rows = _collect(block, params, values)
    if not block.tensors:
        return None
    block.exits = _exits(rows)
    # only the ids on their way to the experts are rotated; other readers (the routing
    # weights gathered by id) keep the router's own numbering
    block.routed = [u for u in ids.users if u in values or u in block.gathers]
    return block


def _reach(start: fx.Node, forward: bool) -> set[fx.Node]:
    out, todo = {start}, [start]
    while todo:
        node = todo.pop()
        for n in node.users if forward else node.all_input_nodes:
            if n not in out:
                out.add(n)
                todo.append(n)
    return out


_LINEAR = {aten.linear.default, aten.mm.default, aten.addmm.default, aten.matmul.default}


def _body(y: fx.Node, shared: set[fx.Node], params: Params) -> tuple[list[fx.Node], list] | None:
    """The nodes only expert output ``y`` needs (back to what the router shares with it)
    and the weights they read; None when something else reads them."""
    body, weights, todo = {y}, [], list(y.all_input_nodes)
    while todo:
        node = todo.pop()
        if node in body or node in shared:
            continue
        if params.is_weight(node):
            weights.append(node)
            body.add(node)
        elif node.op == "call_function":
            body.add(node)
            todo += node.all_input_nodes
        else:
            return None
    if not weights:
        return None
    ordered = [n for n in y.graph.nodes if n in body]
    return ordered, weights


def _lists(router: fx.Node, params: Params) -> Block | None:
    """A block whose experts are separate MLPs, each weighted by a gate from ``router``."""
    scores = _val(router.args[0])
    if not isinstance(scores, torch.Tensor):
        return None
    experts = int(scores.shape[-1])
    after = _reach(router, forward=True)
    shared = _reach(router.args[0], forward=False)
    found = []
    for mul in sorted((n for n in after if target_of(n) is aten.mul.Tensor), key=sort_key):
        for y, gate in (mul.args[:2], mul.args[1::-1]):
            if not isinstance(y, fx.Node) or y.op != "call_function" or len(y.users) != 1:
                continue
            if y in after or y in shared or gate not in after:
                continue
            body = _body(y, shared, params)
            if body is None or not any(target_of(n) in _LINEAR for n in body[0]):
                continue
            inside = set(body[0]) | {mul}
            if all(u in inside for n in body[0] for u in n.users):
                found.append((y, body))
    if len(found) != experts:
        return None
    block = Block(router, router, experts)
    for y, (nodes, weights) in found:
        block.mlps.append((y, nodes))
        block.tensors += weights
        block.exits.append((y, y))
    return block


def find_blocks(gm: fx.GraphModule, params: Params) -> tuple[list[Block], list[str]]:
    """The graph's mixtures of experts (in graph order), and why each router found is not
    one that can be split."""
    blocks, refused = [], []
    for node in gm.graph.find_nodes(op="call_function", target=aten.topk.default):
        try:
            block = _block(node, params)
        except NotExperts as e:
            refused.append(f"'{node.name}': {e}")
            continue
        if block is None:
            block = _lists(node, params)
        if block is not None:
            blocks.append(block)
    return blocks, refused
