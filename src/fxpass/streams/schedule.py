"""Turn a :class:`~fxpass.streams.assignment.StreamPlan` into stream ops in the graph.

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

from ..edit.editor import Editor
from ..edit.memory import Memory
from ..fxutil.ops import schema_of
from ..verify.happens_before import GRAPH_START, Clock, StreamClocks
from ..verify.streams import check_streams
from .assignment import StreamPlan

__all__ = ["ScheduleStats", "apply_plan"]

_FX = torch.ops.fxpass
_Need = dict[int, tuple[int, "fx.Node | None"]]  # stream -> (tick, the kernel at that tick)


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
def _priorities(nodes: list[fx.Node], plan: StreamPlan) -> dict[fx.Node, tuple]:
    pos = {n: i for i, n in enumerate(nodes)}
    key = {n: (i, 0, 0, i) for n, i in pos.items()}
    for rp in plan.regions:
        if not rp.accepted:
            continue
        start = min(pos[n] for n in rp.region.nodes())
        for bp in rp.branches:
            for n in bp.branch.nodes:
                key[n] = (start, 0 if bp.stream else 1, bp.stream, pos[n])
    for node in reversed(nodes):  # what a branch needs comes when it does
        for user in node.users:
            key[node] = min(key[node], key[user])
    return key


def _reorder(graph: fx.Graph, plan: StreamPlan, editor: Editor) -> None:
    nodes = list(graph.nodes)
    key = _priorities(nodes, plan)
    waiting = {n: len(set(n.all_input_nodes)) for n in nodes}
    index = {n: i for i, n in enumerate(nodes)}
    ready = [(key[n], index[n], n) for n in nodes if not waiting[n]]
    heapq.heapify(ready)
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
            editor.move(node, after=prev, rule="multi_stream.order")
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

    def __init__(
        self, gm: fx.GraphModule, plan: StreamPlan, stats: ScheduleStats, memory: Memory,
        editor: Editor,
    ) -> None:  # fmt: skip
        self.graph = gm.graph
        self.stream_of = plan.assignment.get  # absent: stream 0
        self.stats = stats
        self.mem = memory
        self.editor = editor
        self.clocks = StreamClocks()
        self.after: dict[fx.Node, Clock] = {}
        self.last: dict[int, fx.Node] = {}
        self.records: dict[int, list[_Record]] = {}
        self.writes: dict[fx.Node, _Need] = {}
        self.reads: dict[fx.Node, _Need] = {}
        self.first_op = next(n for n in self.graph.nodes if n.op != "placeholder")

    def insert(self, op, args: tuple, stream: int, origin: fx.Node, **where) -> fx.Node:
        name = schema_of(op).name.split("::")[1]
        node = self.editor.insert(
            op, args, rule=f"multi_stream.{name}", origin=[origin], val=None, **where
        )
        node.meta["stream"] = stream
        return node

    def record_after(self, stream: int, tick: int, writer: fx.Node | None) -> _Record:
        """A record on ``stream`` covering its work up to ``tick``: the earliest existing one,
        or a new one right after ``writer`` (``None``: the caller's work before the graph)."""
        fits = [r for r in self.records.get(stream, []) if r.clock.get(stream, 0) >= tick]
        if fits:
            return min(fits, key=lambda r: r.clock.get(stream, 0))
        event = self.stats.events
        self.stats.events += 1
        args = (event, stream)
        if writer is None:
            node = self.insert(_FX.record_event.default, args, stream, self.first_op,
                               before=self.first_op)  # fmt: skip
            clock = {0: GRAPH_START}
        else:
            node = self.insert(_FX.record_event.default, args, stream, writer, after=writer)
            clock = dict(self.after[writer])
        record = _Record(node, event, stream, clock)
        self.records.setdefault(stream, []).append(record)
        return record

    def wait_for(self, needs: _Need, stream: int, before: fx.Node) -> None:
        """Make ``stream`` wait (before ``before``) for each stream's work up to its tick."""
        chosen = [self.record_after(a, t, w) for a, (t, w) in needs.items()]
        for rec in sorted(chosen, key=lambda r: -sum(r.clock.values())):
            tick = needs[rec.stream][0]
            if self.clocks.covers(stream, rec.stream, tick):
                continue  # already covered through an earlier wait's chain
            self.insert(_FX.wait_event.default, (rec.event, stream), stream, before,
                        before=before)  # fmt: skip
            self.stats.waits += 1
            self.clocks.merge(stream, rec.clock)

    def needs(self, node: fx.Node, stream: int) -> _Need:
        written = self.mem.written(node)
        tables = [(root, [self.writes]) for root in self.mem.read(node) if root not in written]
        tables += [(root, [self.writes, self.reads]) for root in written]
        out: _Need = {}
        for root, kinds in tables:
            for table in kinds:
                for a, (tick, who) in table.get(root, {}).items():
                    covered = self.clocks.covers(stream, a, tick)
                    if a != stream and not covered and tick > out.get(a, (0,))[0]:
                        out[a] = (tick, who)
        return out

    def kernel(self, node: fx.Node) -> None:
        s = self.stream_of(node, 0)
        if s != self.clocks.current:
            self.insert(_FX.set_stream.default, (s,), s, node, before=node)
            self.stats.switches += 1
            self.clocks.current = s
        needs = self.needs(node, s)
        if needs:
            self.wait_for(needs, s, node)
        tick = self.clocks.tick(s)
        self.after[node] = dict(self.clocks.clock(s))
        self.last[s] = node
        self.stats.streams_used.add(s)
        self.stats.side_kernels += bool(s)
        written = self.mem.written(node)
        for root in self.mem.read(node):
            if root not in written:
                self.reads.setdefault(root, {})[s] = (tick, node)
        for root in written:
            self.writes.setdefault(root, {})[s] = (tick, node)

    def join(self, output: fx.Node) -> None:
        needs: _Need = {
            s: (self.clocks.now(s), last)
            for s, last in self.last.items()
            if s and not self.clocks.covers(0, s, self.clocks.now(s))
        }
        if self.clocks.current != 0:
            self.insert(_FX.set_stream.default, (0,), 0, output, before=output)
            self.stats.switches += 1
            self.clocks.current = 0
        if needs:
            self.wait_for(needs, 0, output)

    def run(self) -> None:
        for node in list(self.graph.nodes):
            if node.op in ("placeholder", "get_attr"):
                self.writes[node] = {0: (GRAPH_START, None)}
                node.meta["stream"] = 0
            elif node.op == "output":
                self.join(node)
            else:
                node.meta["stream"] = self.stream_of(node, 0)
                if self.mem.kernel(node):
                    self.kernel(node)


# ----- 4. lifetimes --------------------------------------------------------------------------
def _keep_alive(gm: fx.GraphModule, stats: ScheduleStats, memory: Memory, editor: Editor):
    done = set()
    for v in check_streams(gm, memory=memory):
        if v.kind != "freed_early":
            continue
        reader, tensor, root = v.subjects
        if (root, v.stream) in done:
            continue
        done.update((r, v.stream) for r in memory.roots(tensor))  # it keeps all of them
        node = editor.insert(
            _FX.record_stream.default, (tensor, v.stream), rule="multi_stream.record_stream",
            origin=[reader], after=reader, val=None,
        )  # fmt: skip
        node.meta["stream"] = v.stream
        stats.record_streams += 1


def apply_plan(
    gm: fx.GraphModule,
    plan: StreamPlan,
    *,
    memory: Memory | None = None,
    editor: Editor | None = None,
) -> ScheduleStats:
    """Reorder ``gm`` and insert the stream ops ``plan`` needs; the result is checked.

    ``memory``: the graph's storage facts (:class:`~fxpass.edit.memory.Memory`), computed
    here when not given; ``editor``: the editor the changes go through (a pass's
    ``ctx.editor``; default: the run in progress's, ``Editor.current()``).
    """
    stats = ScheduleStats()
    if not plan.assignment:
        return stats
    memory = memory if memory is not None else Memory(gm.graph)
    editor = editor if editor is not None else Editor.current()
    _reorder(gm.graph, plan, editor)
    _Syncs(gm, plan, stats, memory, editor).run()
    _keep_alive(gm, stats, memory, editor)
    problems = check_streams(gm, memory=memory)
    if problems:
        listing = "\n  ".join(str(p) for p in problems[:5])
        raise AssertionError(
            f"multi_stream built a schedule its checker rejects (a bug in fxpass; please "
            f"report it):\n  {listing}"
        )
    return stats
