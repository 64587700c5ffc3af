"""Is a multi-stream schedule safe? :func:`check_streams` proves it or names what is wrong.

A graph with stream ops (:mod:`fxpass.ops.stream`) runs like this: nodes are issued in graph
order; each kernel goes to the current stream (``set_stream``; stream 0 at the start);
``record_event(e, s)`` marks how far stream ``s`` has got, ``wait_event(e, s)`` makes stream
``s`` wait for the last record of ``e``. Streams run concurrently otherwise. The checker
replays the graph with a vector clock per stream and an event table, so "A happens before
B" follows event chains through any number of streams, and checks:

===================== ==========================================================================
kind                  what is wrong
===================== ==========================================================================
``missing_sync``      a kernel reads (or overwrites) memory another stream wrote (or reads),
                      and no record after the first access is waited for before the second
``wait_before_record`` a ``wait_event`` comes before any ``record_event`` of its event: it
                      waits for nothing (or for a record left over from the last call)
``freed_early``       a tensor's last use frees it (the graph drops its last reference) while
                      another stream may still read it, and no ``record_stream`` keeps it:
                      the allocator may hand its memory to new work on the stream it was made on
``unjoined_output``   the graph returns a tensor made on a side stream that the main stream
                      never waited for
``unjoined_stream``   work on a side stream is never joined back into stream 0 before the end
``ends_on_side_stream`` the graph ends with a side stream current (the caller would run there)
``stream_mismatch``   a node's ``meta["stream"]`` says one stream, the ``set_stream`` before it
                      another
``bad_stream_op``     a stream op whose stream or event is not a constant number
===================== ==========================================================================

Memory follows what each node actually does (:class:`fxpass.edit.memory.Memory`, decided
from values): views share their base's memory and run no kernel, a ``reshape`` or
``contiguous`` that copies for its input's layout (of an ``expand``: GQA's repeated keys)
is a kernel with memory of its own, in-place ops write their argument's, and a value is
freed after the last node that uses any view of it (the way ``GraphModule`` code drops
references). Where a node's effect cannot be known (no value, symbolic strides) it is
taken as a kernel whose result may also share its input's memory. Inputs, parameters and
buffers belong to the caller (written on the main stream before the graph starts) and are
never freed by the graph. The ordering itself is :mod:`fxpass.verify.happens_before`; which
stream each node runs on, and each stream op's numbers, the ``stream_assignment`` analysis
(:mod:`fxpass.verify.stream_assignment`, from the run's cache inside a pipeline).

>>> violations = check_streams(gm)                                 # doctest: +SKIP
>>> print("\\n".join(map(str, violations)) or "safe")              # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx

from ..edit.alias import is_kernel
from ..edit.memory import Memory
from ..ops.stream import is_stream_op
from .happens_before import GRAPH_START, StreamClocks
from .stream_assignment import StreamAssignment, stream_args, stream_assignment

__all__ = [
    "StreamScheduleError",
    "StreamViolation",
    "check_streams",
    "is_kernel",
    "require_safe_streams",
    "stream_args",
    "uses_streams",
]

_FX = torch.ops.fxpass


@dataclass(frozen=True)
class StreamViolation:
    """One unsafe spot of a schedule: its ``kind`` (see the module docs), a sentence naming
    the nodes involved, and their names. ``stream`` and ``subjects`` say where a fix goes
    (for ``freed_early``: the reading node, the tensor it read and the value whose memory
    that is, on ``stream``)."""

    kind: str
    message: str
    nodes: tuple[str, ...] = ()
    stream: int | None = None
    subjects: tuple[fx.Node, ...] = field(default=(), compare=False, repr=False)

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}"


class StreamScheduleError(AssertionError):
    """A graph's multi-stream schedule is unsafe; the message lists each violation."""


def uses_streams(gm: fx.GraphModule | fx.Graph) -> bool:
    """Whether the graph has stream ops or nodes marked with ``meta["stream"]``."""
    graph = gm.graph if isinstance(gm, fx.GraphModule) else gm
    return any(is_stream_op(n) or "stream" in n.meta for n in graph.nodes)


# ----- the replay --------------------------------------------------------------------------
@dataclass
class _Access:
    stream: int
    tick: int
    node: fx.Node
    via: fx.Node | None = None  # the input it read the memory through


class _Replay:
    def __init__(self, graph: fx.Graph, memory: Memory, streams: StreamAssignment) -> None:
        self.mem = memory
        self.on = streams
        self.free_after = memory.free_points()
        self.clocks = StreamClocks()
        self.last_tick: dict[int, tuple[int, fx.Node]] = {}
        self.ran_on: dict[fx.Node, int] = {}
        self.records: dict[int, fx.Node] = {}  # event -> its last record_event node
        self.last_wait: dict[tuple[int, int], tuple[fx.Node, fx.Node]] = {}
        self.writes: dict[fx.Node, dict[int, _Access]] = {}
        self.reads: dict[fx.Node, dict[int, _Access]] = {}
        self.foreign: dict[fx.Node, list[_Access]] = {}  # accesses off the allocating stream
        self.kept: set[tuple[fx.Node, int]] = set()  # (root, stream) under record_stream
        self.reported: set[tuple[fx.Node, int]] = set()
        self.out: list[StreamViolation] = []

    def violation(self, kind: str, message: str, *nodes: Any, stream=None, subjects=()) -> None:
        names = tuple(n.name if isinstance(n, fx.Node) else str(n) for n in nodes)
        self.out.append(StreamViolation(kind, message, names, stream, tuple(subjects)))

    # ----- one node ----------------------------------------------------------------------
    def step(self, node: fx.Node) -> None:
        if node.op == "placeholder" or node.op == "get_attr":
            self.writes[node] = {0: _Access(0, GRAPH_START, node)}
        elif self.on.op(node) is not None:
            self.stream_op(node)
        elif node.op == "output":
            self.output(node)
        elif self.mem.kernel(node):
            self.kernel(node)
        for root in self.free_after.get(node, ()):
            self.free(root, node)

    def _ints(self, node: fx.Node) -> tuple[int, ...] | None:
        ints = self.on.numbers(node)
        if ints is None:
            self.violation(
                "bad_stream_op",
                f"{node.name} takes {node.args!r}: streams and events must be constant numbers",
                node,
            )
        return ints

    def stream_op(self, node: fx.Node) -> None:
        ints = self._ints(node)
        if ints is None:
            return
        op = self.on.op(node)
        if op is _FX.record_event.default:
            self.clocks.record(*ints)
            self.records[ints[0]] = node
        elif op is _FX.wait_event.default:
            self.wait(node, *ints)
        elif op is _FX.record_stream.default:
            tensor = node.args[0]
            roots = self.mem.roots(tensor) if isinstance(tensor, fx.Node) else ()
            for root in roots:
                self.kept.add((root, ints[0]))

    def wait(self, node: fx.Node, event: int, stream: int) -> None:
        if not self.clocks.wait(event, stream):
            later = next(
                (
                    n
                    for n in self.on.stream_ops
                    if self.on.op(n) is _FX.record_event.default and n.args[:1] == (event,)
                ),
                None,
            )
            where = f" (its record {later.name} comes later)" if later is not None else ""
            self.violation(
                "wait_before_record",
                f"{node.name} makes stream {stream} wait for event {event} before any "
                f"record_event of it{where}: it waits for nothing",
                node,
                *([later] if later is not None else []),
            )
            return
        for other in self.clocks.events[event]:
            self.last_wait[(stream, other)] = (node, self.records[event])

    def kernel(self, node: fx.Node) -> None:
        s = self.on[node]
        marked = node.meta.get("stream")
        if isinstance(marked, int) and marked != s:
            self.violation(
                "stream_mismatch",
                f"{node.name} is marked for stream {marked} (meta['stream']) but runs on "
                f"stream {s}",
                node,
            )
        tick = self.clocks.tick(s)
        self.last_tick[s] = (tick, node)
        self.ran_on[node] = s
        written = self.mem.written(node)
        for root, via in self.mem.read(node).items():
            if root not in written:
                self.access(root, _Access(s, tick, node, via), write=False)
        for root in written:
            self.access(root, _Access(s, tick, node), write=True)

    def access(self, root: fx.Node, acc: _Access, *, write: bool) -> None:
        earlier = [(self.writes.get(root, {}), True)]
        if write:
            earlier.append((self.reads.get(root, {}), False))
        for table, was_write in earlier:
            for stream, prev in table.items():
                if stream != acc.stream and not self.clocks.covers(acc.stream, stream, prev.tick):
                    self.unordered(root, prev, acc, write, was_write)
        (self.writes if write else self.reads).setdefault(root, {})[acc.stream] = acc
        if acc.stream != self.home(root):
            self.foreign.setdefault(root, []).append(acc)

    def home(self, root: fx.Node) -> int:
        """The stream whose allocator pool ``root``'s memory came from."""
        return self.ran_on.get(self.mem.writer(root), 0)

    def unordered(self, root, prev: _Access, acc: _Access, write: bool, was_write: bool):
        a, b = prev.stream, acc.stream
        if (acc.node, a) in self.reported:
            return  # one violation per node and stream it is not ordered after
        self.reported.add((acc.node, a))
        verb = "overwrites" if write else "reads"
        if prev.node.op in ("placeholder", "get_attr"):
            what = f"{root.name}, an input of the graph (ready on stream 0 when it starts)"
            after = f"stream {b} never waits for stream 0 before {acc.node.name}"
        else:
            did = "wrote" if was_write else "reads"
            what = f"{root.name}, which {prev.node.name} (stream {a}) {did}"
            after = (
                f"stream {b} waits for no event recorded on stream {a} after "
                f"{prev.node.name} before {acc.node.name}"
            )
        hint = ""
        if (b, a) in self.last_wait:
            w, r = self.last_wait[(b, a)]
            hint = f"; its last wait for stream {a} ({w.name}) is for {r.name}, too early"
        self.violation(
            "missing_sync",
            f"{acc.node.name} (stream {b}) {verb} {what}, but {after}{hint}",
            acc.node,
            prev.node,
            root,
            stream=b,
            subjects=(acc.node, prev.node),
        )

    def output(self, node: fx.Node) -> None:
        if self.on[node] != 0:
            self.violation(
                "ends_on_side_stream",
                f"the graph ends with stream {self.on[node]} current: add set_stream(0) before "
                f"{node.name} so the caller continues on the main stream",
                node,
            )
        for root in self.mem.read(node):
            for stream, prev in self.writes.get(root, {}).items():
                if stream != 0 and not self.clocks.covers(0, stream, prev.tick):
                    self.violation(
                        "unjoined_output",
                        f"the graph returns {root.name}, made by {prev.node.name} on stream "
                        f"{stream}, but stream 0 never waits for an event recorded after it",
                        root,
                        prev.node,
                        stream=0,
                    )
        for stream, (tick, last) in sorted(self.last_tick.items()):
            if stream != 0 and not self.clocks.covers(0, stream, tick):
                self.violation(
                    "unjoined_stream",
                    f"stream {stream}'s work up to {last.name} is never joined back into "
                    f"stream 0: record an event on stream {stream} after {last.name} and "
                    f"wait for it on stream 0 before the output",
                    last,
                    stream=stream,
                )

    def free(self, root: fx.Node, at: fx.Node) -> None:
        if root not in self.writes:
            return
        home = self.home(root)
        for acc in self.foreign.get(root, ()):
            if (root, acc.stream) in self.kept or self.clocks.covers(home, acc.stream, acc.tick):
                continue
            self.violation(
                "freed_early",
                f"{root.name} (made on stream {home}) is freed after its last use {at.name} "
                f"while stream {acc.stream} may still be reading it in {acc.node.name}: "
                f"keep it with record_stream({(acc.via or root).name}, {acc.stream}) or make "
                f"stream {home} wait for stream {acc.stream} before {at.name}",
                root,
                at,
                acc.node,
                stream=acc.stream,
                subjects=(acc.node, acc.via or root, root),
            )


def check_streams(
    gm: fx.GraphModule | fx.Graph, *, memory: Memory | None = None
) -> list[StreamViolation]:
    """Every unsafe spot of ``gm``'s multi-stream schedule (empty when it is safe).

    Works on any graph: one the ``multi_stream`` pass scheduled, or one written by hand or
    by another tool with the ``torch.ops.fxpass`` stream ops. A graph without stream ops
    runs on one stream and is safe. ``memory``: the graph's storage facts, when the caller
    already has them (a pass that checks its own schedule).
    """
    graph = gm.graph if isinstance(gm, fx.GraphModule) else gm
    memory = memory if memory is not None else Memory(graph)
    replay = _Replay(graph, memory, stream_assignment(graph))
    for node in graph.nodes:
        replay.step(node)
    return replay.out


def require_safe_streams(gm: fx.GraphModule) -> None:
    """A pipeline check: raise :class:`StreamScheduleError` listing the violations of
    :func:`check_streams` (graphs without stream ops pass at no cost)."""
    if not uses_streams(gm):
        return
    problems = check_streams(gm)
    if problems:
        more = f"\n  (and {len(problems) - 8} more)" if len(problems) > 8 else ""
        listing = "\n  ".join(str(p) for p in problems[:8])
        raise StreamScheduleError(
            f"{len(problems)} unsafe spots in the stream schedule:\n  {listing}{more}"
        )
