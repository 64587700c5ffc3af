"""The ``stream_assignment`` analysis: which stream each node of a graph is issued on.

Nodes are issued in graph order, each on the current stream: the one the last
``set_stream`` before it made current, stream 0 at the start (:mod:`fxpass.ops.stream`).
:class:`StreamAssignment` maps every node to that stream (a ``set_stream`` to the stream it
makes current; ``record_event(e, s)`` and the other event ops act on their own ``s``
whatever it is), keeps each stream op's numbers, and derives the streams used, the kernels
of each stream in order and the stream ops whose numbers are not constants (a
``set_stream`` of those changes nothing). It is what a graph's stream ops *do*, whoever
wrote them; the plan the ``multi_stream`` pass follows is :mod:`fxpass.streams.assignment`.

A registered analysis (:mod:`fxpass.core.analysis_manager`): inside a pass,
``stream_assignment(gm)`` comes from the run's cache. It takes in every change made through
the editor that involves no ``set_stream`` (a node erased, inserted, moved or rewired takes
the stream of the node before it); one that involves a ``set_stream`` drops it.

>>> sa = stream_assignment(gm)                                    # doctest: +SKIP
>>> sa[mm], sa.streams, sa.kernels[1]                             # doctest: +SKIP
(1, [0, 1], [mm])
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import fx

from ..core.analysis_manager import analysis
from ..edit.alias import is_kernel
from ..fxutil.fx_internals import is_erased
from ..ops.stream import stream_op

__all__ = ["StreamAssignment", "stream_args", "stream_assignment"]

_FX = torch.ops.fxpass
_SET = _FX.set_stream.default
_ARITY = {
    _FX.set_stream.default: 1,
    _FX.record_event.default: 2,
    _FX.wait_event.default: 2,
    _FX.record_stream.default: 1,
}


def stream_args(node: fx.Node) -> tuple[int, ...] | None:
    """The constant numbers a stream op takes (after ``record_stream``'s tensor), or None
    when they are not constant numbers."""
    op = stream_op(node)
    if op is None:
        return None
    args = node.args[1:] if op is _FX.record_stream.default else node.args
    if len(args) != _ARITY[op] or node.kwargs:
        return None
    if all(isinstance(a, int) and not isinstance(a, bool) for a in args):
        return tuple(args)
    return None


class StreamAssignment(Mapping[fx.Node, int]):
    """Each node of ``graph`` -> the stream it is issued on (see the module docs). The
    derived lists (:attr:`streams`, :attr:`kernels`, ...) are computed once and shared:
    read them, do not change them."""

    def __init__(self, graph: fx.Graph) -> None:
        self.graph = graph
        self._on: dict[fx.Node, int] = {}
        self._ops: dict[fx.Node, Any] = {}  # stream op node -> its overload
        self._numbers: dict[fx.Node, tuple[int, ...] | None] = {}
        self._derived: dict[str, Any] = {}
        current = 0
        for node in graph.nodes:
            self._note(node, current)
            current = self._on[node]

    # ----- reading ----------------------------------------------------------------------------
    def __getitem__(self, node: fx.Node) -> int:
        return self._on[node]

    def __iter__(self) -> Iterator[fx.Node]:
        return iter(self._on)

    def __len__(self) -> int:
        return len(self._on)

    def op(self, node: fx.Node) -> Any:
        """The stream op overload ``node`` calls, or None."""
        return self._ops.get(node)

    def numbers(self, node: fx.Node) -> tuple[int, ...] | None:
        """A stream op's constant numbers (:func:`stream_args`), or None."""
        return self._numbers.get(node)

    @property
    def stream_ops(self) -> list[fx.Node]:
        """The stream ops, in graph order."""
        return self._derive("stream_ops", lambda: [n for n in self.graph.nodes if n in self._ops])

    @property
    def bad(self) -> list[fx.Node]:
        """The stream ops whose streams or events are not constant numbers, in graph order."""
        return self._derive("bad", lambda: [n for n in self.stream_ops if self._numbers[n] is None])

    @property
    def streams(self) -> list[int]:
        """Every stream the graph issues on or names (0 always), sorted."""

        def named() -> list[int]:
            out = {0, *self._on.values()}
            for node, op in self._ops.items():
                numbers = self._numbers[node]
                if numbers is not None and op is not _SET:
                    out.add(numbers[-1])
            return sorted(out)

        return self._derive("streams", named)

    @property
    def kernels(self) -> dict[int, list[fx.Node]]:
        """Each stream's kernels (:func:`~fxpass.edit.alias.is_kernel`), in graph order."""

        def per_stream() -> dict[int, list[fx.Node]]:
            out: dict[int, list[fx.Node]] = {}
            for node in self.graph.nodes:
                if node not in self._ops and is_kernel(node):
                    out.setdefault(self._on[node], []).append(node)
            return out

        return self._derive("kernels", per_stream)

    def is_kernel(self, node: fx.Node) -> bool:
        """Whether ``node`` is one of :attr:`kernels`."""
        found = self._derive("kernel_set", lambda: {n for ks in self.kernels.values() for n in ks})
        return node in found

    def _derive(self, key: str, make: Any) -> Any:
        if key not in self._derived:
            self._derived[key] = make()
        return self._derived[key]

    # ----- changing -----------------------------------------------------------------------
    def _note(self, node: fx.Node, current: int) -> None:
        """Record ``node``, issued with ``current`` current."""
        op = stream_op(node)
        if op is not None:
            self._ops[node] = op
            numbers = self._numbers[node] = stream_args(node)
            if op is _SET and numbers is not None:
                current = numbers[0]
        self._on[node] = current

    def _forget(self, node: fx.Node) -> None:
        self._on.pop(node, None)
        self._ops.pop(node, None)
        self._numbers.pop(node, None)

    def _before(self, node: fx.Node, told: Mapping[fx.Node, Any]) -> int | None:
        """The stream current right before ``node``: after the nearest node before it that
        is known (those in ``told`` set no stream); None past a node nobody told of."""
        prev = node.prev
        while prev.op != "root":
            if prev in self._on:
                return self._on[prev]
            if prev not in told:
                return None
            prev = prev.prev
        return 0

    def absorb(self, event: Any) -> bool:
        """Take in a change made through the editor (a ``ChangeEvent``) unless a
        ``set_stream`` is among its nodes; False (drop the value) otherwise."""
        graph = self.graph
        told = {
            n: None for n in (*event.old, *event.new) if isinstance(n, fx.Node) and n.graph is graph
        }
        if any(self._ops.get(n) is _SET or stream_op(n) is _SET for n in told):
            return False
        erasing = event.kind == "erase"
        pending = 0  # an erasure is told before it is made
        for node in told:
            self._forget(node)
            if erasing and not is_erased(node):
                pending += 1
        self._derived.clear()
        if not erasing:
            for node in told:
                if is_erased(node):
                    continue
                current = self._before(node, told)
                if current is None:
                    return False
                self._note(node, current)
        return len(self._on) == len(graph.nodes) - pending

    # ----- comparing --------------------------------------------------------------------------
    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, StreamAssignment)
            and self._on == other._on
            and self._ops == other._ops
            and self._numbers == other._numbers
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"<StreamAssignment of {len(self._on)} nodes: streams {self.streams}, "
            f"{len(self._ops)} stream ops>"
        )


@analysis("stream_assignment", update=StreamAssignment.absorb)
def stream_assignment(graph: fx.Graph) -> StreamAssignment:
    """Which stream each node is issued on: the last ``set_stream``'s before it, else 0."""
    return StreamAssignment(graph)
