"""A partition: a set of nodes meant to run together (a backend's subgraph, a fused kernel).

:class:`Partition` is what every partitioner in :mod:`fxpass.partition` returns and what
:func:`~fxpass.partition.fuse.fuse_partitions` takes. It is shaped like torch's
``torch.fx.passes.infra.partitioner.Partition`` (``id``, ``nodes`` as an ordered dict,
``add_node``, ``remove_node``, ``size``), so code written for torch's works with it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch
from torch import fx

__all__ = ["Partition", "find_cycle", "is_cycle_free"]


def module_and_graph(target: Any, who: str = "") -> tuple[fx.GraphModule | None, fx.Graph]:
    """The graph a partitioner works on, and the module holding it (None for a Graph no
    module owns), from a GraphModule, a Graph or an ExportedProgram. ``who`` names the
    caller in the TypeError for anything else."""
    if isinstance(target, torch.export.ExportedProgram):
        return target.graph_module, target.graph_module.graph
    if isinstance(target, fx.GraphModule):
        return target, target.graph
    if isinstance(target, fx.Graph):
        return target.owning_module, target
    where = f"{who}: " if who else ""
    raise TypeError(
        f"{where}expected a GraphModule, Graph or ExportedProgram, got {type(target).__name__}"
    )


class Partition:
    """Nodes of one graph, in topological order (``nodes`` maps node -> torch's order key)."""

    def __init__(
        self,
        id: int | None = None,
        nodes: Iterable[fx.Node] | None = None,
        node_orders: Iterable[int | None] | None = None,
    ) -> None:
        self.id = id
        if nodes is None:
            self.nodes: dict[fx.Node, int | None] = {}
        elif node_orders is None:
            self.nodes = dict.fromkeys(nodes)
        else:
            nodes, node_orders = list(nodes), list(node_orders)
            if len(nodes) != len(node_orders):
                raise ValueError("Partition: nodes and node_orders must have the same length")
            self.nodes = dict(zip(nodes, node_orders))

    # torch's interface -----------------------------------------------------------------------
    def add_node(self, node: fx.Node, node_order: int | None = None) -> None:
        self.nodes[node] = node_order

    def remove_node(self, node: fx.Node) -> None:
        del self.nodes[node]

    def size(self) -> int:
        return len(self.nodes)

    # conveniences ---------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.nodes)

    def __iter__(self) -> Iterator[fx.Node]:
        return iter(self.nodes)

    def __contains__(self, node: object) -> bool:
        return node in self.nodes

    @property
    def names(self) -> list[str]:
        """The node names, in the partition's order."""
        return [n.name for n in self.nodes]

    @property
    def inputs(self) -> list[fx.Node]:
        """Nodes outside the partition that its nodes read, in first-use order."""
        seen: dict[fx.Node, None] = {}
        for node in self.nodes:
            for arg in node.all_input_nodes:
                if arg not in self.nodes:
                    seen[arg] = None
        return list(seen)

    @property
    def outputs(self) -> list[fx.Node]:
        """Nodes of the partition used outside it, in the partition's order."""
        return [n for n in self.nodes if any(u not in self.nodes for u in n.users)]

    def __repr__(self) -> str:
        names = ", ".join(self.names[:8]) + (", ..." if len(self.nodes) > 8 else "")
        return f"Partition(id={self.id}, {len(self.nodes)} nodes: [{names}])"


def _sets(partitions: Sequence[Partition | Iterable[fx.Node]]) -> list[set[fx.Node]]:
    return [set(getattr(p, "nodes", p)) for p in partitions]


def find_cycle(partitions: Sequence[Partition | Iterable[fx.Node]]) -> list[int] | None:
    """Partition indices forming a cycle once every partition is one node; None if none.

    Contracting the partitions must leave a DAG, otherwise they cannot all be fused. This
    walks the contracted graph once (linear in the graph's size).
    """
    sets = _sets(partitions)
    owner: dict[fx.Node, int] = {}
    for i, nodes in enumerate(sets):
        for node in nodes:
            if node in owner:
                raise ValueError(
                    f"node {node.name} is in partitions {owner[node]} and {i}; partitions "
                    "must not overlap"
                )
            owner[node] = i
    return _contracted_cycle(owner, len(sets)) if owner else None


def _contracted_cycle(owner: dict[fx.Node, int], count: int) -> list[int] | None:
    # Vertices: partitions 0..count-1, and every other node. Iterative three-colour DFS.
    def vertex(n: fx.Node):
        return owner.get(n, n)

    members: dict[int, list[fx.Node]] = {}
    for node, i in owner.items():
        members.setdefault(i, []).append(node)

    def successors(v):
        nodes = members[v] if isinstance(v, int) else (v,)
        for node in nodes:
            for user in node.users:
                w = vertex(user)
                if w != v:
                    yield w

    colour: dict[object, int] = {}
    parent: dict[object, object] = {}
    for start in list(range(count)):
        if colour.get(start):
            continue
        colour[start] = 1
        stack = [(start, successors(start))]
        while stack:
            v, it = stack[-1]
            for w in it:
                c = colour.get(w, 0)
                if c == 0:
                    colour[w] = 1
                    parent[w] = v
                    stack.append((w, successors(w)))
                    break
                if c == 1:  # back edge: a cycle through w
                    cycle, x = [w], v
                    while x != w:
                        cycle.append(x)
                        x = parent[x]
                    return [c for c in reversed(cycle) if isinstance(c, int)]
            else:
                colour[v] = 2
                stack.pop()
    return None


def is_cycle_free(partitions: Sequence[Partition | Iterable[fx.Node]]) -> bool:
    """Whether contracting every partition to one node leaves the graph acyclic."""
    return find_cycle(partitions) is None
