"""Topological positions of nodes, and a cycle check local to a matched region.

torch keeps a sort key on every node (``Node._sort_key``, updated by every insertion and
move) that orders nodes as the graph lists them; :class:`TopoOrder` reads it, so positions
cost nothing to maintain. (On a torch without sort keys it numbers the graph itself.)

Fusing a matched region into new nodes creates a cycle exactly when some path leaves the
region and comes back into it. In a graph kept in topological order, every node on such a
path lies before the region's last node, so the search only visits nodes positioned between
the region's outside users and its last node: its cost follows the region, not the graph.
"""

from __future__ import annotations

from collections.abc import Iterable

from torch import fx
from torch.fx import Node

__all__ = ["TopoOrder", "find_cycle", "users_before"]


class TopoOrder:
    """Positions of the nodes of ``graph``, increasing along the graph: ``order[node]``."""

    __slots__ = ("graph", "pos", "renumbers")

    def __init__(self, graph: fx.Graph) -> None:
        self.graph = graph
        self.pos: dict[Node, float] | None = None
        self.renumbers = 0
        first = next(iter(graph.nodes), None)
        if first is None or not hasattr(first, "_sort_key"):
            self.renumber()

    def renumber(self) -> None:
        self.pos = {n: float(i) for i, n in enumerate(self.graph.nodes)}
        self.renumbers += 1

    def __getitem__(self, node: Node):
        pos = self.pos
        if pos is None:
            return node._sort_key
        p = pos.get(node)
        if p is None:  # a node inserted behind our back: start over
            self.renumber()
            p = self.pos[node]  # type: ignore[index]
        return p

    def key(self):
        """A sort key function for nodes (graph order)."""
        return self.__getitem__

    def place(self, nodes: list[Node]) -> None:
        """Give positions to ``nodes``, which now sit consecutively in the graph."""
        pos = self.pos
        if pos is None or not nodes:
            return
        before, after = nodes[0].prev, nodes[-1].next
        lo = pos.get(before, -1.0) if before.op != "root" else -1.0
        hi = lo + len(nodes) + 1.0 if after.op == "root" else pos.get(after)
        if hi is None:
            self.renumber()
            return
        step = (hi - lo) / (len(nodes) + 1)
        if step <= abs(lo) * 1e-12 + 1e-300 or lo >= hi:
            self.renumber()
            return
        for i, n in enumerate(nodes, 1):
            pos[n] = lo + step * i

    def forget(self, nodes: Iterable[Node]) -> None:
        if self.pos is not None:
            for n in nodes:
                self.pos.pop(n, None)


def find_cycle(order: TopoOrder, region: set[Node], hi=None) -> Node | None:
    """A node on a path that leaves ``region`` and re-enters it, or None if there is none.

    ``hi`` is the position of the region's last node (computed when not given).
    """
    pos = order.__getitem__ if order.pos is not None else _sort_key
    if hi is None:
        hi = max(pos(n) for n in region)
    stack = [u for n in region for u in n.users if u not in region and pos(u) < hi]
    seen: set[Node] = set()
    while stack:
        u = stack.pop()
        if u in seen:
            continue
        seen.add(u)
        for w in u.users:
            if w in region:
                return u
            if w not in seen and pos(w) < hi:
                stack.append(w)
    return None


def _sort_key(n: Node):
    return n._sort_key


def users_before(order: TopoOrder, sources: Iterable[Node], region: set[Node], limit):
    """Nodes outside ``region`` positioned before ``limit`` that depend on ``sources``.

    These must move behind the replacement when it is inserted at ``limit`` (multi-output
    rewrites whose inner output is read before the region's last node). Sorted by position.
    """
    pos = order.__getitem__ if order.pos is not None else _sort_key
    stack = [u for s in sources for u in s.users if u not in region and pos(u) < limit]
    if not stack:
        return []
    seen: set[Node] = set()
    while stack:
        u = stack.pop()
        if u in seen:
            continue
        seen.add(u)
        stack.extend(w for w in u.users if w not in seen and w not in region and order[w] < limit)
    return sorted(seen, key=order.__getitem__)
