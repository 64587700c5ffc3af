"""Turn a :class:`~fxpass.streams.plan.StreamPlan` into stream ops in the graph.

1. **Order.** Each split region is laid out branch by branch: the side-stream branches
   first (their kernels are queued early, so the side stream starts while the main stream
   is still busy), then the main-stream branches. A topological sort keeps every
   dependency; nodes outside split regions keep their order.
2. **Streams.** ``set_stream(s)`` goes before the first kernel of each run of kernels on
   stream ``s``; every compute node gets ``meta["stream"]``.
3. **Events.** Replaying the graph with a vector clock per stream, a kernel that reads (or
   overwrites) memory another stream wrote gets a ``wait_event`` on its stream, for a
   ``record_event`` placed right after the producer — only where the clock shows the
   dependency is not already covered, directly or through a chain of earlier waits. Records
   are shared by every wait they serve. Before the output, stream 0 waits for the last
   work of every side stream, and ``set_stream(0)`` makes the main stream current again.
4. **Lifetimes.** A tensor read on a stream other than the one it was allocated on gets a
   ``record_stream`` after that read when the graph would otherwise drop it while the other
   stream may still read it (what :func:`~fxpass.verify.check_streams` calls
   ``freed_early``).

The result is checked with :func:`~fxpass.verify.check_streams`; a schedule that fails the
check is a bug here and raises.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import torch
from torch import fx

from ..verify.streams import _GRAPH_START, _Memory, check_streams, is_kernel
from .plan import StreamPlan

__all__ = ["ScheduleStats", "apply_plan"]

_FX = torch.ops.fxpass
Clock = dict[int, int]


@dataclass
class ScheduleStats:
    """What the schedule added: events recorded, waits, stream switches, lifetime extensions."""

    events: int = 0
    waits: int = 0
    switches: int = 0
    record_streams: int = 0
    side_kernels: int = 0
    streams_used: set[int] = field(default_factory=set)


# ----- 1. order ------------------------------------------------------------------------------
def _priorities(graph: fx.Graph, plan: StreamPlan) -> dict[fx.Node, tuple]:
    pos = {n: i for i, n in enumerate(graph.nodes)}
    key = {n: (i, 0, 0, i) for n, i in pos.items()}
    for rp in plan.regions:
        if not rp.accepted:
            continue
        start = min(pos[n] for n in rp.region.nodes())
        for bp in rp.branches:
            for n in bp.branch.nodes:
                key[n] = (start, 0 if bp.stream else 1, bp.stream, pos[n])
    for node in reversed(list(graph.nodes)):  # what a branch needs comes when it does
        for user in node.users:
            key[node] = min(key[node], key[user])
    return key


def _reorder(graph: fx.Graph, plan: StreamPlan) -> None:
    key = _priorities(graph, plan)
    nodes = list(graph.nodes)
    waiting = {n: len(set(n.all_input_nodes)) for n in nodes}
    ready = [(key[n], i, n) for i, n in enumerate(nodes) if not waiting[n]]
    heapq.heapify(ready)
    index = {n: i for i, n in enumerate(nodes)}
    order = []
    while ready:
        _, _, node = heapq.heappop(ready)
        order.append(node)
        for user in node.users:
            waiting[user] -= 1
            if not waiting[user]:
                heapq.heappush(ready, (key[user], index[user], user))
    assert len(order) == len(nodes), "the graph has a cycle"
    prev = None
    for node in order:
        if prev is not None and prev.next is not node:
            prev.append(node)
        prev = node


# ----- 2 and 3. streams and events ---------------------------------------------------------
@dataclass
class _Record:
    node: fx.Node
    event: int
    stream: int
    clock: Clock


class _Syncs:
    """Walk the reordered graph and insert set_stream / record_event / wait_event."""

    def __init__(self, gm: fx.GraphModule, plan: StreamPlan, stats: ScheduleStats) -> None:
        self.graph = gm.graph
        self.stream_of = plan.assignment.get  # absent: stream 0
        self.stats = stats
        self.mem = _Memory(self.graph)
        self.cur = 0
        self.clock: dict[int, Clock] = {0: {0: _GRAPH_START}}
        self.after: dict[fx.Node, Clock] = {}
        self.last: dict[int, fx.Node] = {}
        self.records: dict[int, list[_Record]] = {}
        self.writes: dict[fx.Node, dict[int, tuple[int, fx.Node | None]]] = {}
        self.reads: dict[fx.Node, dict[int, tuple[int, fx.Node | None]]] = {}
        self.first_op = next(n for n in self.graph.nodes if n.op != "placeholder")

    def vc(self, stream: int) -> Clock:
        return self.clock.setdefault(stream, {})

    def insert(self, before: fx.Node, op, args: tuple, stream: int) -> fx.Node:
        with self.graph.inserting_before(before):
            node = self.graph.call_function(op, args)
        node.meta["stream"] = stream
        node.meta["val"] = None
        return node

    def record_after(self, stream: int, tick: int, writer: fx.Node | None) -> _Record:
        """A record on ``stream`` covering its work up to ``tick``: the earliest existing one,
        or a new one right after ``writer`` (``None``: the caller's work before the graph)."""
        fits = [r for r in self.records.get(stream, []) if r.clock.get(stream, 0) >= tick]
        if fits:
            return min(fits, key=lambda r: r.clock.get(stream, 0))
        event = self.stats.events
        self.stats.events += 1
        if writer is None:
            node = self.insert(self.first_op, _FX.record_event.default, (event, stream), stream)
            clock = {0: _GRAPH_START}
        else:
            with self.graph.inserting_after(writer):
                node = self.graph.call_function(_FX.record_event.default, (event, stream))
            node.meta.update(stream=stream, val=None)
            clock = dict(self.after[writer])
        record = _Record(node, event, stream, clock)
        self.records.setdefault(stream, []).append(record)
        return record

    def wait_for(self, needs: dict[int, tuple[int, fx.Node | None]], stream: int, before) -> None:
        """Make ``stream`` wait (before ``before``) for each stream's work up to its tick."""
        chosen = [self.record_after(a, t, w) for a, (t, w) in needs.items()]
        clock = self.vc(stream)
        for rec in sorted(chosen, key=lambda r: -sum(r.clock.values())):
            if all(clock.get(a, 0) >= t for a, (t, _) in needs.items() if a == rec.stream):
                continue  # already covered through an earlier wait's chain
            self.insert(before, _FX.wait_event.default, (rec.event, stream), stream)
            self.stats.waits += 1
            for s, t in rec.clock.items():
                clock[s] = max(clock.get(s, 0), t)

    def needs(self, node: fx.Node, stream: int) -> dict[int, tuple[int, fx.Node | None]]:
        written = self.mem.written(node)
        tables = [(root, [self.writes]) for root in self.mem.read(node) if root not in written]
        tables += [(root, [self.writes, self.reads]) for root in written]
        clock = self.vc(stream)
        out: dict[int, tuple[int, fx.Node | None]] = {}
        for root, kinds in tables:
            for table in kinds:
                for a, (tick, who) in table.get(root, {}).items():
                    if a != stream and clock.get(a, 0) < tick and tick > out.get(a, (0,))[0]:
                        out[a] = (tick, who)
        return out

    def kernel(self, node: fx.Node) -> None:
        s = self.stream_of(node, 0)
        if s != self.cur:
            self.insert(node, _FX.set_stream.default, (s,), s)
            self.stats.switches += 1
            self.cur = s
        needs = self.needs(node, s)
        if needs:
            self.wait_for(needs, s, node)
        clock = self.vc(s)
        clock[s] = clock.get(s, 0) + 1
        self.after[node] = dict(clock)
        self.last[s] = node
        self.stats.streams_used.add(s)
        self.stats.side_kernels += bool(s)
        written = self.mem.written(node)
        for root in self.mem.read(node):
            if root not in written:
                self.reads.setdefault(root, {})[s] = (clock[s], node)
        for root in written:
            self.writes.setdefault(root, {})[s] = (clock[s], node)

    def join(self, output: fx.Node) -> None:
        clock0 = self.vc(0)
        needs = {
            s: (self.vc(s)[s], last)
            for s, last in self.last.items()
            if s and clock0.get(s, 0) < self.vc(s)[s]
        }
        if self.cur != 0:
            self.insert(output, _FX.set_stream.default, (0,), 0)
            self.stats.switches += 1
            self.cur = 0
        if needs:
            self.wait_for(needs, 0, output)

    def run(self) -> None:
        for node in list(self.graph.nodes):
            if node.op in ("placeholder", "get_attr"):
                self.writes[node] = {0: (_GRAPH_START, None)}
                node.meta["stream"] = 0
            elif node.op == "output":
                self.join(node)
            else:
                node.meta["stream"] = self.stream_of(node, 0)
                if is_kernel(node):
                    self.kernel(node)


# ----- 4. lifetimes --------------------------------------------------------------------------
def _keep_alive(gm: fx.GraphModule, stats: ScheduleStats) -> None:
    done = set()
    for v in check_streams(gm):
        if v.kind != "freed_early":
            continue
        reader, tensor, memory = v.subjects
        if (memory, v.stream) in done:
            continue
        done.add((memory, v.stream))
        with gm.graph.inserting_after(reader):
            node = gm.graph.call_function(_FX.record_stream.default, (tensor, v.stream))
        node.meta.update(stream=v.stream, val=None)
        stats.record_streams += 1


def apply_plan(gm: fx.GraphModule, plan: StreamPlan) -> ScheduleStats:
    """Reorder ``gm`` and insert the stream ops ``plan`` needs; the result is checked."""
    stats = ScheduleStats()
    if not plan.assignment:
        return stats
    _reorder(gm.graph, plan)
    _Syncs(gm, plan, stats).run()
    _keep_alive(gm, stats)
    problems = check_streams(gm)
    if problems:
        listing = "\n  ".join(str(p) for p in problems[:5])
        raise AssertionError(
            f"multi_stream built a schedule its checker rejects (a bug in fxpass; please "
            f"report it):\n  {listing}"
        )
    return stats
