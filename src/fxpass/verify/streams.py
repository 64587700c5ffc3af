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

Memory follows the op schemas: views share their base's memory, in-place ops write their
argument's, and a value is freed after the last node that uses any view of it (the way
``GraphModule`` code drops references). Inputs, parameters and buffers belong to the caller
(written on the main stream before the graph starts) and are never freed by the graph.

>>> violations = check_streams(gm)                                 # doctest: +SKIP
>>> print("\\n".join(map(str, violations)) or "safe")              # doctest: +SKIP
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx

from ..edit.alias import aliased_args, op_schema, written_args
from ..fxutil.values import node_val
from ..ops.stream import is_stream_op, stream_op

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
_GRAPH_START = 1  # the tick on stream 0 at which the caller's tensors were written


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


# ----- which nodes run kernels, and which memory they touch ------------------------------
_aten = torch.ops.aten
_HOST_OPS = frozenset(  # sizes and metadata checks: the host answers, no kernel runs
    {
        _aten.sym_size.int,
        _aten.sym_stride.int,
        _aten.sym_numel.default,
        _aten.sym_storage_offset.default,
        _aten._assert_tensor_metadata.default,
        _aten._assert_scalar.default,
    }
)


def _is_view(node: fx.Node) -> bool:
    """A schema view (``Tensor(a)`` out, nothing written): metadata only, no kernel."""
    return op_schema(node) is not None and bool(aliased_args(node)) and not written_args(node)


def _tensorish(val: Any) -> bool:
    if val is None:
        return True  # unknown: assume the worst
    if isinstance(val, torch.Tensor):
        return True
    if isinstance(val, (list, tuple)):
        return any(isinstance(v, torch.Tensor) for v in val)
    return False


def is_kernel(node: fx.Node) -> bool:
    """Does ``node`` launch work on the current stream? Not: inputs, outputs, stream ops,
    ``getitem``, views (schema aliases), sizes and metadata checks."""
    if node.op not in ("call_function", "call_method", "call_module"):
        return False
    if is_stream_op(node) or node.target is operator.getitem or node.target in _HOST_OPS:
        return False
    if _is_view(node):
        return False
    return _tensorish(node_val(node)) or any(_tensorish(node_val(i)) for i in node.all_input_nodes)


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


def uses_streams(gm: fx.GraphModule | fx.Graph) -> bool:
    """Whether the graph has stream ops or nodes marked with ``meta["stream"]``."""
    graph = gm.graph if isinstance(gm, fx.GraphModule) else gm
    return any(is_stream_op(n) or "stream" in n.meta for n in graph.nodes)


class _Memory:
    """Storage of each value: ``roots`` (the nodes whose fresh memory it may share), who
    writes each root, and where each root is freed."""

    def __init__(self, graph: fx.Graph) -> None:
        self.pos: dict[fx.Node, int] = {}
        self.roots: dict[fx.Node, frozenset[fx.Node]] = {}
        holders: dict[fx.Node, set[fx.Node]] = {}
        for i, node in enumerate(graph.nodes):
            self.pos[node] = i
            roots = self._roots_of(node)
            self.roots[node] = roots
            for r in roots:
                holders.setdefault(r, set()).add(node)
                if r.target is operator.getitem and r is node:  # the tuple holds it too
                    holders[r].add(r.args[0])
        self.free_at: dict[int, list[fx.Node]] = {}
        for root, nodes in holders.items():
            if self.external(root):
                continue
            last = -1
            for holder in nodes:
                for user in holder.users:
                    last = max(last, 1 << 60 if user.op == "output" else self.pos[user])
            if 0 <= last < 1 << 60:
                self.free_at.setdefault(last, []).append(root)

    def _roots_of(self, node: fx.Node) -> frozenset[fx.Node]:
        if node.op in ("placeholder", "get_attr"):
            return frozenset({node})
        if node.op == "output" or is_stream_op(node) or not _tensorish(node_val(node)):
            return frozenset()
        if op_schema(node) is not None and not node.target._schema.returns:
            return frozenset()  # returns nothing: no memory of its own
        if node.target is operator.getitem:
            parent = node.args[0]
            pieces = isinstance(parent, fx.Node) and op_schema(parent) is not None
            if pieces and aliased_args(parent):  # split/unbind: pieces of the input
                return self.roots.get(parent, frozenset())
            return frozenset({node})
        shared = frozenset().union(*(self.roots.get(a, frozenset()) for a in aliased_args(node)))
        if op_schema(node) is not None and shared:
            return shared  # a schema view or an in-place op's result: no fresh memory
        return shared | {node}  # fresh memory (and, for opaque calls, maybe the inputs')

    @staticmethod
    def external(root: fx.Node) -> bool:
        return root.op in ("placeholder", "get_attr")

    @staticmethod
    def writer(root: fx.Node) -> fx.Node:
        """The node whose kernel wrote a fresh root (a tuple element's: the op's)."""
        if root.target is operator.getitem and isinstance(root.args[0], fx.Node):
            return root.args[0]
        return root

    def written(self, node: fx.Node) -> set[fx.Node]:
        """Roots ``node``'s kernel writes: its fresh memory and what it writes in place."""
        out = {r for r in self.roots[node] if self.writer(r) is node and not self.external(r)}
        out |= {r for r in self._tuple_elements(node)}
        for arg in written_args(node):
            out |= self.roots.get(arg, frozenset())
        return out

    def _tuple_elements(self, node: fx.Node) -> list[fx.Node]:
        return [u for u in node.users if u.target is operator.getitem and u in self.roots[u]]

    def read(self, node: fx.Node) -> dict[fx.Node, fx.Node]:
        """Root -> the input through which ``node`` reads it."""
        out: dict[fx.Node, fx.Node] = {}
        for arg in node.all_input_nodes:
            for r in self.roots.get(arg, frozenset()):
                out.setdefault(r, arg)
        return out


# ----- the replay --------------------------------------------------------------------------
Clock = dict[int, int]


def _covers(clock: Clock, stream: int, tick: int) -> bool:
    return clock.get(stream, 0) >= tick


def _join(into: Clock, other: Clock) -> None:
    for s, t in other.items():
        if t > into.get(s, 0):
            into[s] = t


@dataclass
class _Access:
    stream: int
    tick: int
    node: fx.Node
    via: fx.Node | None = None  # the input it read the memory through


class _Replay:
    def __init__(self, graph: fx.Graph) -> None:
        self.mem = _Memory(graph)
        self.cur = 0
        self.clock: dict[int, Clock] = {0: {0: _GRAPH_START}}
        self.last_tick: dict[int, tuple[int, fx.Node]] = {}
        self.ran_on: dict[fx.Node, int] = {}
        self.events: dict[int, tuple[Clock, fx.Node]] = {}
        self.last_wait: dict[tuple[int, int], tuple[fx.Node, fx.Node]] = {}
        self.writes: dict[fx.Node, dict[int, _Access]] = {}
        self.reads: dict[fx.Node, dict[int, _Access]] = {}
        self.foreign: dict[fx.Node, list[_Access]] = {}  # accesses off the allocating stream
        self.kept: set[tuple[fx.Node, int]] = set()  # (root, stream) under record_stream
        self.reported: set[tuple[fx.Node, int]] = set()
        self.out: list[StreamViolation] = []

    def vc(self, stream: int) -> Clock:
        return self.clock.setdefault(stream, {})

    def violation(self, kind: str, message: str, *nodes: Any, stream=None, subjects=()) -> None:
        names = tuple(n.name if isinstance(n, fx.Node) else str(n) for n in nodes)
        self.out.append(StreamViolation(kind, message, names, stream, tuple(subjects)))

    # ----- one node ----------------------------------------------------------------------
    def step(self, node: fx.Node) -> None:
        if node.op == "placeholder" or node.op == "get_attr":
            self.writes[node] = {0: _Access(0, _GRAPH_START, node)}
        elif is_stream_op(node):
            self.stream_op(node)
        elif node.op == "output":
            self.output(node)
        elif is_kernel(node):
            self.kernel(node)
        for root in self.mem.free_at.get(self.mem.pos[node], ()):
            self.free(root, node)

    def _ints(self, node: fx.Node) -> tuple[int, ...] | None:
        ints = stream_args(node)
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
        op = stream_op(node)
        if op is _FX.set_stream.default:
            self.cur = ints[0]
        elif op is _FX.record_event.default:
            event, stream = ints
            self.events[event] = (dict(self.vc(stream)), node)
        elif op is _FX.wait_event.default:
            self.wait(node, *ints)
        elif op is _FX.record_stream.default:
            tensor = node.args[0]
            for root in self.mem.roots.get(tensor, ()):
                self.kept.add((root, ints[0]))

    def wait(self, node: fx.Node, event: int, stream: int) -> None:
        if event not in self.events:
            later = next(
                (
                    n
                    for n in node.graph.nodes
                    if stream_op(n) is _FX.record_event.default and n.args[:1] == (event,)
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
        snapshot, record = self.events[event]
        _join(self.vc(stream), snapshot)
        for other in snapshot:
            self.last_wait[(stream, other)] = (node, record)

    def kernel(self, node: fx.Node) -> None:
        s = self.cur
        marked = node.meta.get("stream")
        if isinstance(marked, int) and marked != s:
            self.violation(
                "stream_mismatch",
                f"{node.name} is marked for stream {marked} (meta['stream']) but runs on "
                f"stream {s}",
                node,
            )
        clock = self.vc(s)
        clock[s] = clock.get(s, 0) + 1
        tick = clock[s]
        self.last_tick[s] = (tick, node)
        self.ran_on[node] = s
        written = self.mem.written(node)
        for root, via in self.mem.read(node).items():
            if root not in written:
                self.access(root, _Access(s, tick, node, via), write=False)
        for root in written:
            self.access(root, _Access(s, tick, node), write=True)

    def access(self, root: fx.Node, acc: _Access, *, write: bool) -> None:
        clock = self.vc(acc.stream)
        earlier = [(self.writes.get(root, {}), True)]
        if write:
            earlier.append((self.reads.get(root, {}), False))
        for table, was_write in earlier:
            for stream, prev in table.items():
                if stream != acc.stream and not _covers(clock, stream, prev.tick):
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
        if self.cur != 0:
            self.violation(
                "ends_on_side_stream",
                f"the graph ends with stream {self.cur} current: add set_stream(0) before "
                f"{node.name} so the caller continues on the main stream",
                node,
            )
        clock = self.vc(0)
        for root in self.mem.read(node):
            for stream, prev in self.writes.get(root, {}).items():
                if stream != 0 and not _covers(clock, stream, prev.tick):
                    self.violation(
                        "unjoined_output",
                        f"the graph returns {root.name}, made by {prev.node.name} on stream "
                        f"{stream}, but stream 0 never waits for an event recorded after it",
                        root,
                        prev.node,
                        stream=0,
                    )
        for stream, (tick, last) in sorted(self.last_tick.items()):
            if stream != 0 and not _covers(clock, stream, tick):
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
        clock = self.vc(home)
        for acc in self.foreign.get(root, ()):
            if (root, acc.stream) in self.kept or _covers(clock, acc.stream, acc.tick):
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


def check_streams(gm: fx.GraphModule | fx.Graph) -> list[StreamViolation]:
    """Every unsafe spot of ``gm``'s multi-stream schedule (empty when it is safe).

    Works on any graph: one the ``multi_stream`` pass scheduled, or one written by hand or
    by another tool with the ``torch.ops.fxpass`` stream ops. A graph without stream ops
    runs on one stream and is safe.
    """
    graph = gm.graph if isinstance(gm, fx.GraphModule) else gm
    replay = _Replay(graph)
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
