"""The editor's journal: what each node was before a run's editor first changed it.

Every change a pass makes through the :class:`~fxpass.edit.Editor` is announced to the
journal of the run first (``Editor`` asks its listener for ``journal``): the nodes the change
will touch — the node, the nodes it reads and will read (their users change), its
neighbours in the graph's list — are saved once, the first time, with their links,
arguments, users, name and metadata, and each graph's own state (namespace, length,
insertion point) the first time one of its nodes is. Undoing writes those states back into
the very same objects: nodes the pass made fall out of the list, nodes it erased are
linked again. The cost is in proportion to the nodes changed, not to the graph.

What the journal cannot see: an edit that does not go through the editor (``node.args =``,
``graph.erase_node``, a metadata write on a node the editor never touched). A pass that makes
such edits declares it (``fp.register(..., edits="any")``, the default for functions not
registered by fxpass), and the run takes a whole-graph snapshot before it instead
(:mod:`fxpass.core.snapshot`).

The journal also says which nodes changed since a mark (:meth:`Journal.touched`): the
run's checks lint those and their neighbours instead of the whole graph.

>>> journal = Journal()                        # doctest: +SKIP
>>> journal.before(node, *node.all_input_nodes)  # doctest: +SKIP
>>> ...                                        # the edit  # doctest: +SKIP
>>> journal.undo()                             # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from torch import fx

from ..fxutil.fx_internals import graph_end, input_nodes, is_erased
from ..fxutil.fx_state import (
    graph_header,
    node_neighbours,
    node_state,
    restore_graph_header,
    restore_node_states,
    state_before_made,
)

__all__ = ["Journal"]


_BY_VALUE = (6, 7, 10)  # inputs, users (dicts of nodes), the sort key (a tuple of ints)


def _same_state(a: tuple, b: tuple) -> bool:
    """Two :func:`node_state` s alike: the same objects, the same metadata entries."""
    meta_a, meta_b = a[9], b[9]
    return (
        all(x is y or (i in _BY_VALUE and x == y) for i, (x, y) in enumerate(zip(a, b)) if i != 9)
        and meta_a.keys() == meta_b.keys()
        and all(meta_a[k] is meta_b[k] for k in meta_a)
    )


class Journal:
    """The first state of every node a run's editor changed, restorable (see the module)."""

    __slots__ = (
        "_epoch", "_graphs", "_made", "_new", "_order", "_pass", "_pass_made", "_states",
    )  # fmt: skip

    def __init__(self) -> None:
        self._states: dict[fx.Node, tuple] = {}
        self._graphs: dict[fx.Graph, tuple] = {}
        self._made: dict[fx.Graph, list[fx.Node]] = {}
        self._new: set[fx.Node] = set()  # the nodes made: nothing to put back
        # every node changed or made, once after each mark, in the order first seen
        self._order: list[fx.Node] = []
        # since the mark: each node changed, with its state then (None: a node made)
        self._pass: dict[fx.Node, tuple | None] = {}
        self._pass_made: list[fx.Node] = []  # since the mark: the nodes made
        self._epoch = 0  # marks made: a mark inside a pass (a nested run) ends its own

    def __len__(self) -> int:
        return len(self._order)

    def mark(self) -> int:
        """A position: :meth:`touched` lists the nodes changed or made after it, and
        :meth:`changed` says whether the graph is other than it was."""
        self._pass.clear()
        self._pass_made.clear()
        self._epoch += 1
        return len(self._order)

    @property
    def epoch(self) -> int:
        """How many marks were made (a mark made since another ends what it tracked)."""
        return self._epoch

    def changed(self, epoch: int) -> bool:
        """Whether a node made since the :meth:`mark` (made at ``epoch``) is still in its
        graph, or a node changed since is other than it was then (nodes made and erased
        again, a rewrite declined, are no change). True when another mark came since."""
        if epoch != self._epoch:
            return True
        if any(not is_erased(n) for n in self._pass_made):
            return True
        return any(
            old is not None and not _same_state(old, node_state(n)) for n, old in self._pass.items()
        )

    def touched(self, since: int = 0) -> list[fx.Node]:
        """The nodes changed or made after ``since`` (each once per mark: repeats only
        across a mark made since)."""
        return self._order[since:]

    def before_create(self, graph: fx.Graph) -> None:
        """About to make a node in ``graph``: keep the graph's own state first."""
        if graph not in self._graphs:
            self._graphs[graph] = graph_header(graph)
            self._made[graph] = []

    def before(self, *nodes: Any) -> None:
        """About to change ``nodes`` (and so the users of the nodes they read, and their
        neighbours when they move or go): save each, and those, the first time."""
        # one dict lookup for a node seen since the mark: an erase of a fused region asks
        # for ~50 nodes per rewrite, most of them seen already (inside the region, or by
        # the nodes erased before them)
        this_pass = self._pass
        for n in nodes:
            if not isinstance(n, fx.Node):
                continue
            for m in (n, *input_nodes(n), *node_neighbours(n)):
                if m not in this_pass:
                    self._see(m)

    def _see(self, m: fx.Node) -> None:
        """``m`` changes for the first time since the mark: note it, and keep its state
        then (and, the first time ever, as the state an undo puts back)."""
        self._order.append(m)
        if m in self._new:
            self._pass[m] = None
            return
        state = self._pass[m] = node_state(m)
        if m not in self._states:
            self._states[m] = state
            self.before_create(m.graph)

    def reads(self, nodes: Iterable[Any]) -> None:
        """About to make a node read ``nodes``: their users change."""
        this_pass = self._pass
        for n in nodes:
            if isinstance(n, fx.Node) and n not in this_pass:
                self._see(n)

    def made(self, node: fx.Node) -> None:
        """``node`` was just made (nothing else changed since): it goes on undo, with no
        state of its own to keep. The nodes it reads gained it as their last user and its
        neighbours' links now reach it; those not seen since the mark are kept as they were
        before it came."""
        self.before_create(node.graph)
        new, states, this_pass, order = self._new, self._states, self._pass, self._order
        before, after = node_neighbours(node)
        for m in (*input_nodes(node), before, after):
            if m in this_pass:
                continue
            order.append(m)
            if m in new:
                this_pass[m] = None
                continue
            state = this_pass[m] = state_before_made(m, node)
            states.setdefault(m, state)
        new.add(node)
        this_pass[node] = None
        order.append(node)
        self._pass_made.append(node)
        self._made[node.graph].append(node)

    def undo(self) -> None:
        """Put every saved node and graph back as it was when first saved."""
        by_graph: dict[fx.Graph, dict[fx.Node, tuple]] = {g: {} for g in self._graphs}
        for n, state in self._states.items():
            by_graph[n.graph][n] = state
        for graph, header in self._graphs.items():
            restore_node_states(graph, by_graph[graph], self._made[graph])
            restore_graph_header(graph, header)
        self.clear()

    def clear(self) -> None:
        self._states.clear()
        self._graphs.clear()
        self._made.clear()
        self._new.clear()
        self._pass.clear()
        self._pass_made.clear()
        self._order.clear()

    def audit_start(self, graph: fx.Graph) -> dict[fx.Node, tuple]:
        """Every node of ``graph`` as it is now, for :meth:`audit` (a whole-graph copy: the
        full checks' way to hold a pass to ``edits="editor"``)."""
        return {n: node_state(n) for n in (graph_end(graph), *graph.nodes)}

    def audit(self, before: dict[fx.Node, tuple]) -> list[str]:
        """The nodes of ``before`` that changed but were not saved, or were saved other than
        they were: edits the journal did not see (what an undo would miss)."""
        out = []
        for n, old in before.items():
            if n in self._new:
                continue
            kept = self._pass.get(n)
            if kept is None and n in self._states:
                continue  # saved by an earlier pass; this one did not change it through the editor
            if not _same_state(old, kept if kept is not None else node_state(n)):
                out.append(n.name or "(the graph's end)")
        return out

    def graphs(self) -> Iterator[fx.Graph]:
        """The graphs the journal saved nodes of."""
        return iter(self._graphs)
