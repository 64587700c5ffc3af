"""A graph's state, saved and written back into the very same objects: exact rollback.

Two grains of one concept. :class:`GraphState` saves everything of a whole graph a pass can
change (the rollback snapshot taken before a pass that may edit outside the editor,
``core/snapshot.py``); :func:`node_state` and :func:`graph_header` save one node or the
graph's own fields, the first time the editor's journal (``edit/journal.py``) sees a change
touch them, and :func:`restore_node_states` writes them back. Both read and write torch.fx's
private node and graph fields, so they live in ``fxutil`` beside ``fx_internals.py``: a torch
upgrade that renames one changes these files only.
"""

from __future__ import annotations

from torch import fx
from torch.fx.graph import _FindNodesLookupTable

__all__ = [
    "GraphState",
    "graph_header",
    "node_neighbours",
    "node_state",
    "restore_graph_header",
    "restore_node_states",
    "state_before_made",
]

_set = object.__setattr__


class GraphState:
    """Everything of a graph and its nodes that a pass can change, restorable into the very
    same objects: nodes a pass created fall out of the list, nodes it erased are re-linked."""

    __slots__ = ("co_fields", "codegen", "graph", "insert", "length", "namespace", "nodes")

    def __init__(self, graph: fx.Graph) -> None:
        self.graph = graph
        self.nodes = [
            (
                n,
                n.name,
                n.op,
                n.target,
                n.type,
                n._args,
                n._kwargs,
                dict(n._input_nodes),
                dict(n.users),
                n.meta,
                dict(n.meta),
                n._sort_key,
                n._repr_fn,
            )
            for n in graph.nodes
        ]
        ns = graph._graph_namespace
        self.namespace = (dict(ns._obj_to_name), set(ns._used_names), dict(ns._base_count))
        self.length = graph._len
        self.insert = graph._insert
        self.codegen = graph._codegen
        self.co_fields = dict(getattr(graph, "_co_fields", {}))

    def restore(self) -> None:
        graph = self.graph
        root = graph._root
        table = _FindNodesLookupTable()
        prev = root
        for n, *state in self.nodes:
            _restore_node(n, prev, graph, *state)
            table.insert(n)
            prev = n
        _set(prev, "_next", root)
        _set(root, "_prev", prev)
        ns = graph._graph_namespace
        ns._obj_to_name, ns._used_names, ns._base_count = (
            dict(self.namespace[0]),
            set(self.namespace[1]),
            dict(self.namespace[2]),
        )
        graph._len = self.length
        graph._insert = self.insert
        graph._codegen = self.codegen
        graph._co_fields = dict(self.co_fields)
        graph._find_nodes_lookup_table = table


def _restore_node(
    n, prev, graph, name, op, target, typ, args, kwargs, inputs, users, meta, saved, key, repr_fn
) -> None:
    _set(n, "_prev", prev)
    _set(prev, "_next", n)
    _set(n, "name", name)
    _set(n, "op", op)
    _set(n, "target", target)
    _set(n, "type", typ)
    _set(n, "_args", args)
    _set(n, "_kwargs", kwargs)
    _set(n, "_input_nodes", inputs)
    _set(n, "users", users)
    _set(n, "_sort_key", key)
    _set(n, "_repr_fn", repr_fn)
    _set(n, "_erased", False)
    _set(n, "graph", graph)
    _set(n, "meta", meta)
    meta.clear()
    meta.update(saved)


def node_state(n: fx.Node) -> tuple:
    """Everything of one node a pass can change, for :func:`restore_node_states`."""
    return _state(n, dict(n.users), n._prev, n._next)


def _state(n: fx.Node, users: dict, prev: fx.Node, nxt: fx.Node) -> tuple:
    """The layout of :func:`node_state`, with its users and links as given."""
    return (
        n.name, n.op, n.target, n.type, n._args, n._kwargs, dict(n._input_nodes),
        users, n.meta, dict(n.meta), n._sort_key, n._repr_fn, prev, nxt,
    )  # fmt: skip


def node_neighbours(n: fx.Node) -> tuple[fx.Node, fx.Node]:
    """The nodes before and after ``n`` in its graph's list (the end sentinel at the ends)."""
    return n._prev, n._next


def state_before_made(n: fx.Node, made: fx.Node) -> tuple:
    """:func:`node_state` of ``n`` as it was before ``made`` was just made: not yet among
    its users (when ``made`` reads it), not yet linked before or after it (when it is
    ``made``'s neighbour). One tuple built, for the nodes a new node changed."""
    users = dict(n.users)
    users.pop(made, None)
    prev, nxt = n._prev, n._next
    if nxt is made:
        nxt = made._next
    if prev is made:
        prev = made._prev
    return _state(n, users, prev, nxt)


def graph_header(graph: fx.Graph) -> tuple:
    """A graph's own state besides its nodes (namespace, length, insertion point, code)."""
    ns = graph._graph_namespace
    return (
        (dict(ns._obj_to_name), set(ns._used_names), dict(ns._base_count)),
        graph._len,
        graph._insert,
        graph._codegen,
        dict(getattr(graph, "_co_fields", {})),
    )


def restore_graph_header(graph: fx.Graph, header: tuple) -> None:
    (names, used, base), graph._len, graph._insert, graph._codegen, co_fields = header
    ns = graph._graph_namespace
    ns._obj_to_name, ns._used_names, ns._base_count = dict(names), set(used), dict(base)
    graph._co_fields = dict(co_fields)


def restore_node_states(graph: fx.Graph, states: dict, made: list[fx.Node]) -> None:
    """Write saved :func:`node_state` s back into the very same nodes; nodes ``made`` since
    fall out of the graph's lookup table (the restored links no longer reach them)."""
    table = graph._find_nodes_lookup_table
    for n in made:
        if n in table:
            table.remove(n)
    for n in states:
        if n is not graph._root and n in table:
            table.remove(n)
    for n, (name, op, target, typ, args, kwargs, inputs, users, meta, saved, key, repr_fn,
            prev, nxt) in states.items():  # fmt: skip
        for attr, value in (
            ("name", name), ("op", op), ("target", target), ("type", typ), ("_args", args),
            ("_kwargs", kwargs), ("_input_nodes", inputs), ("users", users), ("meta", meta),
            ("_sort_key", key), ("_repr_fn", repr_fn), ("_prev", prev), ("_next", nxt),
            ("_erased", False), ("graph", graph),
        ):  # fmt: skip
            _set(n, attr, value)
        meta.clear()
        meta.update(saved)
    for n in states:
        if n is not graph._root:
            table.insert(n)
