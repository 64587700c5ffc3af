"""The analyses fxpass ships: positions, users, aliasing, fake values.

Each is an :class:`~fxpass.core.analysis_manager.Analysis`: call it on a module or graph
inside a pass (``positions(gm)``) and the run's manager computes it once and serves it until
the graph changes (see :mod:`fxpass.core.analysis_manager`). Other packages register their
own the same way (the stream assignment of :mod:`fxpass.verify.stream_assignment`, for one).

Some changes made through the editor leave most of an analysis right, and it takes them in
instead of being computed again (its ``update``): an erased node leaves ``positions``,
``users``, ``aliasing`` and ``fake_values``; a use replaced by another value of the graph is
taken in by ``positions`` and ``aliasing`` (the memory the readers share is recomputed for
them alone), and by ``fake_values`` when the two values have the same metadata. Positions
stay increasing along the graph, with gaps where nodes went.

==================  ===========================================================================
``positions``       each node's index in the graph's order (``dict[Node, int]``)
``users``           each node's users in graph order (``dict[Node, tuple[Node, ...]]``)
``aliasing``        who writes which memory and which values share it
                    (:class:`fxpass.edit.alias.AliasInfo`)
``fake_values``     each node's value propagated again on fake tensors from the graph's
                    inputs (:class:`FakeValues`): shape propagation, and which recorded
                    ``meta['val']`` went stale
==================  ===========================================================================
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import fx

from ..edit.alias import AliasInfo
from ..fxutil.fx_internals import is_erased
from ..fxutil.values import FakeEvaluator, Strictness, node_val, same_value
from .analysis_manager import analysis

__all__ = ["FakeValues", "aliasing", "fake_values", "positions", "users"]


def _gone(event: Any) -> list[fx.Node] | None:
    """The nodes a change took out of the graph — an erasure's node, a replaced value that
    was erased — or None when the change added or rewired something (then it is not taken
    in)."""
    if event.kind == "erase":
        return list(event.old)
    if event.kind == "replace" and len(event.old) == 1 and len(event.new) == 1:
        return [n for n in event.old if is_erased(n)]
    return None


def _in_order(pos: dict[fx.Node, int]) -> list[fx.Node]:
    return sorted(pos, key=pos.__getitem__)


def _same_order(a: dict[fx.Node, int], b: dict[fx.Node, int]) -> bool:
    return a.keys() == b.keys() and _in_order(a) == _in_order(b)


def _positions_update(pos: dict[fx.Node, int], event: Any) -> bool:
    gone = _gone(event)
    if gone is None or not all(isinstance(n, fx.Node) and n in pos for n in event.new):
        return False
    for node in gone:
        pos.pop(node, None)
    return True


@analysis("positions", equal=_same_order, update=_positions_update)
def positions(graph: fx.Graph) -> dict[fx.Node, int]:
    """Each node's position: increasing along the graph's order (indices when computed)."""
    return {node: i for i, node in enumerate(graph.nodes)}


def _users_update(users: dict[fx.Node, tuple[fx.Node, ...]], event: Any) -> bool:
    if event.kind != "erase":
        return False
    for node in event.old:
        if is_erased(node):  # its inputs are unknown now
            return False
        users.pop(node, None)
        for a in node.all_input_nodes:
            if a in users:
                users[a] = tuple(u for u in users[a] if u is not node)
    return True


@analysis("users", update=_users_update)
def users(graph: fx.Graph) -> dict[fx.Node, tuple[fx.Node, ...]]:
    """Each node's users, in graph order."""
    pos = positions(graph)
    return {n: tuple(sorted(n.users, key=pos.__getitem__)) for n in graph.nodes}


def _same_aliasing(a: AliasInfo, b: AliasInfo) -> bool:
    return (
        _same_order(a.pos, b.pos)
        and a.written_by == b.written_by
        and a.output is b.output
        and all(a.roots(n) == b.roots(n) for n in a.pos)
    )


def _aliasing_update(info: AliasInfo, event: Any) -> bool:
    if event.kind == "erase":
        for node in event.old:
            info.forget(node)
        return True
    if event.kind == "replace" and len(event.old) == 1 and len(event.new) == 1:
        return info.replace(event.old[0], event.new[0])
    return False


@analysis("aliasing", equal=_same_aliasing, update=_aliasing_update)
def aliasing(graph: fx.Graph) -> AliasInfo:
    """Who writes which memory and which values share it (see :mod:`fxpass.edit.alias`)."""
    return AliasInfo(graph)


class FakeValues(Mapping[fx.Node, Any]):
    """Each node's value computed again on fake tensors (autograd off), from the inputs'
    recorded values forward (a node whose op the fake mode cannot run keeps its recorded
    value; those are listed in ``failures``). :meth:`stale` names the nodes whose recorded ``meta['val']``
    no longer matches."""

    def __init__(self, graph: fx.Graph) -> None:
        self.graph = graph
        evaluator = FakeEvaluator.for_graph(graph, strictness=Strictness.DECLINE)
        values: dict[fx.Node, Any] = {}
        with torch.no_grad():  # graphs fxpass transforms run below autograd
            for node in graph.nodes:
                if node.op in ("call_function", "call_method"):
                    value = evaluator.rerun(node, value=values.get)
                    values[node] = node_val(node) if value is None else value
                elif node.op != "output":
                    values[node] = node_val(node)
        self._values = values
        self.failures = list(evaluator.failures)

    def __getitem__(self, node: fx.Node) -> Any:
        return self._values[node]

    def __iter__(self) -> Iterator[fx.Node]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def absorb(self, event: Any) -> bool:
        """Take in a change made through the editor, if it leaves every other value as it
        was: an erasure, or a use replaced by a value with the same metadata."""
        gone = _gone(event)
        if gone is None:
            return False
        values = self._values
        if event.kind == "replace":
            old, new = event.old[0], event.new[0]
            if new not in values or not same_value(values.get(old), values[new], grad=False):
                return False
        for node in gone:
            values.pop(node, None)
        return True

    def stale(self) -> list[fx.Node]:
        """Nodes whose recorded example value differs from the propagated one."""
        return [
            n
            for n, v in self._values.items()
            if v is not None and not same_value(v, node_val(n), grad=False)
        ]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, FakeValues) or self._values.keys() != other._values.keys():
            return False
        return all(same_value(v, other._values[n], grad=False) for n, v in self._values.items())

    __hash__ = None  # type: ignore[assignment]


@analysis("fake_values", update=FakeValues.absorb)
def fake_values(graph: fx.Graph) -> FakeValues:
    """Each node's value propagated again on fake tensors (shape propagation)."""
    return FakeValues(graph)
