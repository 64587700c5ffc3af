"""Which memory each value of a graph lives in, which kernel writes it, and when the graph
frees it: the storage model multi-stream scheduling and its checker share.

Each value's *roots* are the nodes whose fresh memory it may live in: a view's roots are its
base's, a kernel's result is its own root, a tuple element (``getitem`` of ``topk``) is its
own root written by the tuple's kernel, an in-place result is the memory it wrote. What a
node does is decided from values (:func:`~fxpass.edit.alias.node_memory`): a ``reshape``
of an ``expand`` is a kernel with memory of its own, a ``reshape`` of a contiguous tensor a
view of it. Inputs, parameters and buffers belong to the caller: they are never freed by
the graph.

A root is freed after the last node that uses any value holding it (the way
``GraphModule`` code drops references): :meth:`Memory.free_points` says where, for the
graph's current order.

>>> memory = Memory(gm.graph)                                     # doctest: +SKIP
>>> memory.kernel(reshape), memory.roots(reshape)                 # doctest: +SKIP
(True, frozenset({reshape}))
"""

from __future__ import annotations

import operator
from collections.abc import Iterable

from torch import fx

from ..fxutil.values import node_val
from ..ops.stream import is_stream_op
from .alias import NodeMemory, _tensorish, node_memory, op_schema, written_args

__all__ = ["Memory"]

_OUT_OF_GRAPH = 1 << 60  # the output "uses" a value: it is never freed inside the graph


class Memory:
    """Storage facts of one graph, computed once; nodes added later (stream ops, or any
    node) are analysed when first asked about."""

    def __init__(self, graph: fx.Graph) -> None:
        self.graph = graph
        self._facts: dict[fx.Node, NodeMemory] = {}
        self._roots: dict[fx.Node, frozenset[fx.Node]] = {}
        for node in graph.nodes:
            self.roots(node)

    # ----- per node ---------------------------------------------------------------------------
    def facts(self, node: fx.Node) -> NodeMemory:
        """What ``node`` does with memory (:class:`~fxpass.edit.alias.NodeMemory`)."""
        found = self._facts.get(node)
        if found is None:
            found = self._facts[node] = node_memory(node)
        return found

    def kernel(self, node: fx.Node) -> bool:
        """Does ``node`` launch work on the current stream?"""
        return self.facts(node).kernel

    def roots(self, node: fx.Node) -> frozenset[fx.Node]:
        """The nodes whose fresh memory ``node``'s value may live in."""
        found = self._roots.get(node)
        if found is None:
            for arg in node.all_input_nodes:  # a node added after the snapshot
                if arg not in self._roots:
                    self.roots(arg)
            found = self._roots[node] = self._roots_of(node)
        return found

    def _roots_of(self, node: fx.Node) -> frozenset[fx.Node]:
        if node.op in ("placeholder", "get_attr"):
            return frozenset({node})
        if node.op == "output" or is_stream_op(node) or not _tensorish(node_val(node)):
            return frozenset()
        schema = op_schema(node)
        if schema is not None and not schema.returns:
            return frozenset()  # returns nothing: no memory of its own
        if node.target is operator.getitem:
            parent = node.args[0]
            if isinstance(parent, fx.Node) and self.facts(parent).kind == "view":
                return self._roots.get(parent, frozenset())  # split/unbind: input pieces
            return frozenset({node})
        facts = self.facts(node)
        shared = frozenset().union(*(self._roots.get(a, frozenset()) for a in facts.shares))
        return shared | {node} if facts.fresh or not shared else shared

    @staticmethod
    def external(root: fx.Node) -> bool:
        """Is ``root`` the caller's memory (an input, parameter or buffer)?"""
        return root.op in ("placeholder", "get_attr")

    @staticmethod
    def writer(root: fx.Node) -> fx.Node:
        """The node whose kernel wrote a fresh root (a tuple element's: the op's)."""
        if root.target is operator.getitem and isinstance(root.args[0], fx.Node):
            return root.args[0]
        return root

    def written(self, node: fx.Node) -> set[fx.Node]:
        """Roots ``node``'s kernel writes: its fresh memory and what it writes in place."""
        mine = self.roots(node)
        out = {r for r in mine if self.writer(r) is node and not self.external(r)}
        out |= {
            u for u in node.users if u.target is operator.getitem and u in self.roots(u)
        }  # tuple elements the kernel wrote
        for arg in written_args(node):
            out |= self.roots(arg)
        return out

    def read(self, node: fx.Node) -> dict[fx.Node, fx.Node]:
        """Root -> the input through which ``node`` reads it."""
        out: dict[fx.Node, fx.Node] = {}
        for arg in node.all_input_nodes:
            for r in self.roots(arg):
                out.setdefault(r, arg)
        return out

    # ----- lifetimes --------------------------------------------------------------------------
    def free_points(self, nodes: Iterable[fx.Node] | None = None) -> dict[fx.Node, list[fx.Node]]:
        """Node -> the roots the graph frees right after it (their last holder's last use),
        for the order ``nodes`` (default: the graph's current order)."""
        order = list(self.graph.nodes if nodes is None else nodes)
        pos = {n: i for i, n in enumerate(order)}
        holders: dict[fx.Node, set[fx.Node]] = {}
        for node in order:
            for r in self.roots(node):
                holders.setdefault(r, set()).add(node)
                if r is node and r.target is operator.getitem:  # the tuple holds it too
                    holders[r].add(r.args[0])
        out: dict[fx.Node, list[fx.Node]] = {}
        for root, nodes_ in holders.items():
            if self.external(root):
                continue
            last = -1
            for holder in nodes_:
                for user in holder.users:
                    at = _OUT_OF_GRAPH if user.op == "output" else pos.get(user, -1)
                    last = max(last, at)
            if 0 <= last < _OUT_OF_GRAPH:
                out.setdefault(order[last], []).append(root)
        return out
