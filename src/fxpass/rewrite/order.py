"""Topological positions of nodes, and a cycle check local to a matched region.

torch keeps a sort key on every node (``Node._sort_key``, updated by every insertion and
move) that orders nodes as the graph lists them; :class:`TopoOrder` reads it, so positions
cost nothing to maintain.

Fusing a matched region into new nodes creates a cycle exactly when some path leaves the
region and comes back into it. In a graph kept in topological order, every node on such a
path lies before the region's last node, so the search only visits nodes positioned between
the region's outside users and its last node: its cost follows the region, not the graph.
"""

from __future__ import annotations

from collections.abc import Iterable

from torch import fx
from torch.fx import Node

from ..fxutil.fx import sort_key

__all__ = ["TopoOrder", "find_cycle", "users_before"]


class TopoOrder:
    """Positions of the nodes of ``graph``, increasing along the graph: ``order[node]``."""

    __slots__ = ("graph",)

    def __init__(self, graph: fx.Graph) -> None:
        self.graph = graph

    def __getitem__(self, node: Node):
        return sort_key(node)

    def key(self):
        """A sort key function for nodes (graph order)."""
        return sort_key


def find_cycle(
    order: TopoOrder, region: set[Node], hi=None, exits: Iterable[Node] | None = None
) -> Node | None:
    """A node on a path that leaves ``region`` and re-enters it, or None if there is none.

    ``hi`` is the position of the region's last node (computed when not given); ``exits``
    the region's nodes that have users outside it, where known (default: all of them).
    """
    pos = sort_key
    if hi is None:
        hi = max(pos(n) for n in region)
    starts = region if exits is None else exits
    stack = [u for n in starts for u in n.users if u not in region and pos(u) < hi]
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


def users_before(order: TopoOrder, sources: Iterable[Node], region: set[Node], limit):
    """Nodes outside ``region`` positioned before ``limit`` that depend on ``sources``.

    These must move behind the replacement when it is inserted at ``limit`` (multi-output
    rewrites whose inner output is read before the region's last node). Sorted by position.
    """
    pos = sort_key
    stack = [u for s in sources for u in s.users if u not in region and pos(u) < limit]
    if not stack:
        return []
    seen: set[Node] = set()
    while stack:
        u = stack.pop()
        if u in seen:
            continue
        seen.add(u)
        stack.extend(w for w in u.users if w not in seen and w not in region and pos(w) < limit)
    return sorted(seen, key=pos)
