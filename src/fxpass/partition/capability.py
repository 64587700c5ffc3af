"""Capability partitioning: the largest cycle-free groups of nodes a backend supports.

:func:`capability_partitions` returns the partitions torch's ``CapabilityBasedPartitioner``
proposes, in time linear in the graph instead of torch's roughly cubic time.

Why it can be linear. Torch visits nodes in reverse topological order and merges each
supported node into the *oldest* partition it can join without creating a cycle (trying every
partition, with a reachability scan per try). Two facts make that greedy choice cheap:

* every new partition is created only when its first node reaches (through nodes outside it)
  every partition that already exists, so the partitions are totally ordered by reachability:
  the younger reaches all the older ones;
* hence the set of partitions a node reaches is always a prefix ``0..m`` of the partitions in
  creation order, and one integer ``m`` per node describes it.

A supported node ``v`` cannot join any partition up to ``B = max(level(u) - 1 for supported
users u, m(u) for the others)``, so it joins partition ``B + 1`` (a new one when that does not
exist yet): its *level*, the number of unsupported stretches between it and the end of the
graph on the longest path. Partitions are the supported nodes grouped by level — one pass
over the nodes and their users. Partitions of one level may be disconnected ("horizontal
fusion", as in torch); ``horizontal=False`` (torch's ``skip_horizontal_fusion=True``) merges
only along edges, with an exact cycle check per merge.

After grouping, as torch does: ``getitem`` users of a node follow it into its partition, and
unless ``allows_single_node_partition``, partitions with at most one compute node are dropped
(``non_compute_ops`` do not count; ``allowed_single_node_partition_ops`` count twice). fxpass
also trims non-compute ops from the partitions' ends first (torch's
``remove_bookend_non_compute_ops``), so a view never starts or ends a partition.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import fx

from ..fxutil.dialect import aten_op
from ..fxutil.fx_internals import qualified_name
from .base import Partition, module_and_graph
from .support import CALLABLE_OPS, OperatorSupportBase, parse_support, resolve_op

__all__ = [
    "DEFAULT_NON_COMPUTE_OPS",
    "capability_partitions",
    "op_matcher",
    "torch_name_matcher",
]

#: Ops that never count as compute (torch's defaults, matched here by op packet).
DEFAULT_NON_COMPUTE_OPS: tuple[str, ...] = ("torch.ops.aten.view", "_operator.getitem")

NodePredicate = Callable[[fx.Node], bool]


# ----- matching ops by name ----------------------------------------------------------------------
def _packet_name(target: Any) -> str | None:
    packet = getattr(target, "overloadpacket", None)
    if isinstance(packet, torch._ops.OpOverloadPacket):
        return "torch.ops." + packet._qualified_op_name.replace("::", ".")
    return None


def _canonical(op: Any) -> str:
    if isinstance(op, str):
        text = op.strip()
        try:
            op = resolve_op(text)
        except ValueError:
            return text  # a name we cannot import: compare it as written
    op = aten_op(op)
    if isinstance(op, torch._ops.OpOverloadPacket):
        return "torch.ops." + op._qualified_op_name.replace("::", ".")
    return qualified_name(op)


def op_matcher(ops: Iterable[Any] | None) -> NodePredicate:
    """A predicate: does a ``call_function`` node call one of ``ops``?

    ``ops`` are ops or names in any spelling (``aten.view``, ``torch.ops.aten.view.default``,
    ``_operator.getitem``, ``getitem``); a packet name matches all of its overloads, and an
    ATen op matches its ExecuTorch Edge op.
    """
    names = frozenset(_canonical(op) for op in ops or ())
    if not names:
        return _never
    return _name_matcher(names, packets=True)


def torch_name_matcher(names: Iterable[str]) -> NodePredicate:
    """torch's matching: the qualified name of the target, compared as a string."""
    return _name_matcher(frozenset(names), packets=False)


def _never(node: fx.Node) -> bool:
    return False


def _name_matcher(names: frozenset[str], *, packets: bool) -> NodePredicate:
    """Does a ``call_function`` node's target have one of ``names`` as its qualified name
    (or, with ``packets``, as the name of its op packet)? Answers are cached per target."""
    cache: dict[Any, bool] = {}

    def matches(node: fx.Node) -> bool:
        if node.op != "call_function":
            return False
        target = node.target
        hit = cache.get(target)
        if hit is None:
            op = aten_op(target)  # an Edge op matches as the ATen op it wraps
            hit = (
                qualified_name(target) in names
                or (op is not target and qualified_name(op) in names)
                or (packets and _packet_name(op) in names)
            )
            cache[target] = hit
        return hit

    return matches


# ----- the greedy partitioning -------------------------------------------------------------------
def _by_level(nodes: Sequence[fx.Node], supported: NodePredicate) -> list[Partition]:
    """Torch's horizontal greedy, in one reverse pass (see the module docstring).

    Returns partitions in torch's order with torch's ids: an id is the number of supported
    nodes seen before the partition's first node, or before its second one (torch merges a
    one-node partition into the newcomer's).
    """
    level: dict[fx.Node, int] = {}  # supported node -> its partition (level)
    reach: dict[fx.Node, int] = {}  # other node -> youngest partition it reaches (-1: none)
    groups: list[list[tuple[fx.Node, int]]] = []
    ids: list[int] = []
    seq = 0
    for order, v in enumerate(reversed(nodes)):
        if supported(v):
            blocked = -1
            for u in v.users:
                k = level.get(u)
                b = k - 1 if k is not None else reach.get(u, -1)
                if b > blocked:
                    blocked = b
            k = blocked + 1
            if k == len(groups):
                groups.append([])
                ids.append(seq)
            elif len(groups[k]) == 1:
                ids[k] = seq
            groups[k].append((v, order))
            level[v] = k
            seq += 1
        else:
            m = -1
            for u in v.users:
                k = level.get(u)
                r = k if k is not None else reach.get(u, -1)
                if r > m:
                    m = r
            reach[v] = m
    parts = [
        Partition(i, (n for n, _ in reversed(g)), (o for _, o in reversed(g)))
        for i, g in zip(ids, groups)
    ]
    parts.sort(key=lambda p: p.id)
    return parts


class _Vertical:
    """Torch's ``skip_horizontal_fusion=True``: merge a node's new partition with its users'
    partitions, one by one, when contracting them leaves the graph acyclic.

    The cycle check searches *backwards* from the two partitions for one of their users:
    only nodes after the current one can be on a cycle, and the ancestors of a partition among
    them are usually few, where the nodes downstream of it are the rest of the graph.
    """

    def __init__(self, nodes: Sequence[fx.Node]) -> None:
        self.nodes = nodes
        self.position = {n: i for i, n in enumerate(nodes)}
        self.assignment: dict[fx.Node, int] = {}
        self.parts: dict[int, dict[fx.Node, int]] = {}
        self.users: dict[int, set[fx.Node]] = {}
        self.inputs: dict[int, set[fx.Node]] = {}

    def run(self, supported: NodePredicate) -> list[Partition]:
        seq = itertools.count()
        nodes = self.nodes
        for order, v in enumerate(reversed(nodes)):
            if v in self.assignment or not supported(v):
                continue
            pid = next(seq)
            self.parts[pid] = {v: order}
            self.users[pid] = set(v.users)
            self.inputs[pid] = set(v.all_input_nodes)
            self.assignment[v] = pid
            candidates = dict.fromkeys(
                [pid] + [self.assignment[u] for u in v.users if u in self.assignment]
            )
            ids = list(candidates)
            current = ids[0]
            floor = len(nodes) - 1 - order
            for other in ids[1:]:
                current = self._maybe_merge(current, other, floor)
        out = []
        for pid, members in self.parts.items():
            ordered = sorted(members.items(), key=operator.itemgetter(1), reverse=True)
            out.append(Partition(pid, (n for n, _ in ordered), (o for _, o in ordered)))
        return out

    def _maybe_merge(self, a: int, b: int, floor: int) -> int:
        nodes_a, nodes_b = self.parts[a], self.parts[b]
        users = (self.users[a] | self.users[b]).difference(nodes_a, nodes_b)
        inputs = (self.inputs[a] | self.inputs[b]).difference(nodes_a, nodes_b)
        if users and self._reaches(inputs, users, floor):
            return a
        keep, gone = (b, a) if len(nodes_a) < len(nodes_b) else (a, b)
        self.parts[keep].update(self.parts.pop(gone))
        for node in self.parts[keep]:
            self.assignment[node] = keep
        del self.users[gone], self.inputs[gone]
        self.users[keep] = users
        self.inputs[keep] = inputs
        return keep

    def _reaches(self, inputs: Iterable[fx.Node], users: set[fx.Node], floor: int) -> bool:
        """Whether one of ``users`` is an ancestor of ``inputs`` (so merging would close a
        cycle), with every partition contracted to one node. Nodes before ``floor`` are not
        partitioned yet and cannot be reached from ``users``: the search skips them."""
        position = self.position
        stack = [x for x in inputs if position[x] > floor]
        seen: set[fx.Node] = set()
        seen_parts: set[int] = set()
        user_parts = {self.assignment[u] for u in users if u in self.assignment}
        while stack:
            x = stack.pop()
            if x in users:
                return True
            if x in seen:
                continue
            seen.add(x)
            pid = self.assignment.get(x)
            if pid is None:
                preds = x.all_input_nodes
            elif pid in user_parts:
                return True
            elif pid not in seen_parts:
                seen_parts.add(pid)
                preds = self.inputs[pid]
            else:
                continue
            stack.extend(p for p in preds if position[p] > floor)
        return False


def _getitems_follow(nodes: Sequence[fx.Node], parts: list[Partition]) -> None:
    """``getitem`` users of a tuple-producing node go where the producer is (torch's step)."""
    by_id = {p.id: p for p in parts}
    owner = {n: p.id for p in parts for n in p.nodes}
    while True:
        moves: dict[fx.Node, int | None] = {}
        for node in nodes:
            users = node.users
            if not all(u.op == "call_function" and u.target is operator.getitem for u in users):
                continue
            pid = owner.get(node)
            for user in users:
                if owner.get(user) != pid:
                    moves[user] = pid
        if not moves:
            return
        for node, pid in moves.items():
            old = owner.pop(node, None)
            if old is not None:
                by_id[old].remove_node(node)
            if pid is not None:
                owner[node] = pid
                by_id[pid].add_node(node, None)


def _drop_single_compute(
    parts: list[Partition], non_compute: NodePredicate, allowed_single: NodePredicate
) -> list[Partition]:
    kept = []
    for part in parts:
        compute = 0
        for node in part.nodes:
            if node.op == "call_function":
                if not callable(node.target):
                    raise TypeError(f"node {node.name} calls {node.target!r}, not a callable")
                compute += (not non_compute(node)) + allowed_single(node)
        if compute > 1:
            kept.append(part)
    return kept


def remove_bookend_non_compute(parts: Iterable[Partition], non_compute: NodePredicate) -> None:
    """Remove non-compute nodes at a partition's boundary (torch's
    ``remove_bookend_non_compute_ops``): ones whose inputs all come from outside (or from such
    nodes), or whose users are all outside (or such nodes)."""
    for part in parts:
        for node in _bookends(part, non_compute):
            part.nodes.pop(node, None)


def _bookends(part: Partition, non_compute: NodePredicate) -> set[fx.Node]:
    members = set(part.nodes)
    removed: set[fx.Node] = set()
    as_input: dict[fx.Node, bool] = {}
    as_output: dict[fx.Node, bool] = {}

    def transparent(node: fx.Node, memo: dict, neighbours: Callable) -> bool:
        if node.op == "placeholder" or node not in members or node in removed:
            return True
        if node not in memo:
            memo[node] = non_compute(node) and all(
                transparent(n, memo, neighbours) for n in neighbours(node)
            )
        return memo[node]

    for node in part.nodes:
        if non_compute(node) and (
            transparent(node, as_input, lambda n: n.all_input_nodes)
            or transparent(node, as_output, lambda n: n.users)
        ):
            removed.add(node)
    return removed


def propose(
    nodes: Sequence[fx.Node],
    supported: NodePredicate,
    *,
    horizontal: bool = True,
    allows_single_node_partition: bool = False,
    non_compute: NodePredicate,
    allowed_single: NodePredicate,
    trim: NodePredicate | None = None,
) -> list[Partition]:
    """The partitioning steps shared by :func:`capability_partitions` and the torch drop-in:
    greedy grouping, getitem fix-up, optional trimming, single-node filtering. Returns
    partitions in torch's order with torch's ids, empty ones removed."""
    if horizontal:
        parts = _by_level(nodes, supported)
    else:
        parts = _Vertical(nodes).run(supported)
    _getitems_follow(nodes, parts)
    if trim is not None:
        remove_bookend_non_compute(parts, trim)
    if not allows_single_node_partition:
        parts = _drop_single_compute(parts, non_compute, allowed_single)
    return [p for p in parts if p.size() > 0]


def capability_partitions(
    graph_module: fx.GraphModule | fx.Graph | torch.export.ExportedProgram,
    support: OperatorSupportBase | Any,
    *,
    allows_single_node_partition: bool = False,
    non_compute_ops: Sequence[Any] | None = None,
    allowed_single_node_partition_ops: Sequence[Any] | None = None,
    horizontal: bool = True,
    trim_non_compute: bool = True,
) -> list[Partition]:
    """The largest cycle-free partitions of the nodes ``support`` accepts.

    ``support`` is a support object or anything :func:`~fxpass.partition.parse_support`
    reads (``"elementwise | norm"``, a dict, a list of ops). Only nodes that call something
    (``call_function``, ``call_module``, ``call_method``) are asked.

    * ``allows_single_node_partition``: keep partitions with one compute node (default: drop).
    * ``non_compute_ops``: ops that do not count as compute, in addition to ``aten.view`` and
      ``getitem``; a partition of these alone is dropped, and with ``trim_non_compute`` they
      are trimmed from partition ends.
    * ``allowed_single_node_partition_ops``: ops that may form a partition alone.
    * ``horizontal``: also merge partitions not connected by an edge (torch's default).

    Partitions come in graph order (by first node), nodes in topological order, ids 0, 1, ...
    Runs in time linear in the graph with ``horizontal=True``.

    >>> parts = capability_partitions(gm, "elementwise | norm")      # doctest: +SKIP
    """
    owner, graph = module_and_graph(graph_module, "capability_partitions")
    modules = dict(owner.named_modules()) if owner is not None else {}
    support = parse_support(support)
    nodes = list(graph.nodes)

    def supported(node: fx.Node) -> bool:
        return node.op in CALLABLE_OPS and bool(support.is_node_supported(modules, node))

    non_compute = op_matcher([*DEFAULT_NON_COMPUTE_OPS, *(non_compute_ops or ())])
    trim = _trimmable(non_compute) if trim_non_compute else None
    parts = propose(
        nodes,
        supported,
        horizontal=horizontal,
        allows_single_node_partition=allows_single_node_partition,
        non_compute=non_compute,
        allowed_single=op_matcher(allowed_single_node_partition_ops),
        trim=trim,
    )
    position = {n: i for i, n in enumerate(nodes)}
    for part in parts:
        part.nodes = dict(sorted(part.nodes.items(), key=lambda item: position[item[0]]))
    parts.sort(key=lambda p: position[next(iter(p.nodes))])
    for i, part in enumerate(parts):
        part.id = i
    return parts


def _trimmable(non_compute: NodePredicate) -> NodePredicate:
    """Non-compute, except ``getitem``: after the getitem fix-up it sits with its producer,
    and trimming it would make the partition return a tuple."""

    def trimmable(node: fx.Node) -> bool:
        return node.target is not operator.getitem and non_compute(node)

    return trimmable
