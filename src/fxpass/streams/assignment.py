"""Which branches go to which stream: the cost model decides, region by region.

For each independent region (:func:`~fxpass.streams.regions.find_regions`) the branches are
spread over ``streams`` streams, largest first, each to the least loaded stream (stream 0
first, so the largest branch stays on the main stream and needs no sync). The region runs
on several streams only when that saves at least ``min_gain_us`` by the cost model, and
more than splitting the regions inside its branches instead would:

    serial   = sum of the branches' estimated times
    parallel = the most loaded stream's time + 2 syncs (fork and join) per side stream used

Some work stays put:

* a branch with a **collective** stays on stream 0 (overlapping collectives with other
  streams corrupted outputs in TensorRT-LLM's AutoDeploy; ranks must issue them in one order);
* a region whose branches **write memory in place** that they did not allocate themselves,
  have other **side effects**, or draw **random numbers** keeps its order and its stream:
  reordering it could change what another branch reads or which numbers each draws. A
  write to memory the branch allocated itself is proven safe (no other branch can see it).

Users can also choose: ``side=["*.shared_expert"]`` puts every node from matching modules
(``nn_module_stack`` paths, ``fnmatch`` patterns) on a side stream, and an integer
``node.meta["stream"]`` set before the pass is kept as it is.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass, field

from torch import fx

from ..edit.alias import written_args
from ..edit.memory import Memory
from .cost import CostModel
from .regions import Branch, Region, find_regions, is_collective, is_random

__all__ = ["BranchPlan", "RegionPlan", "StreamPlan", "plan_streams"]


@dataclass
class BranchPlan:
    """A branch, its estimated time, the stream it got, and why it must stay on stream 0."""

    branch: Branch
    cost_us: float
    stream: int = 0
    pinned: str = ""


@dataclass
class RegionPlan:
    """The decision for one region: where each branch goes, and whether it is worth it."""

    region: Region
    branches: list[BranchPlan]
    serial_us: float = 0.0
    parallel_us: float = 0.0
    accepted: bool = False
    reason: str = ""

    @property
    def gain_us(self) -> float:
        return self.serial_us - self.parallel_us if self.accepted else 0.0

    def __str__(self) -> str:
        r = self.region
        parts = " | ".join(
            f"{b.branch.label} [{b.stream}] {b.cost_us:.1f} us" for b in self.branches
        )
        verdict = "split" if self.accepted else "kept on stream 0"
        return f"{r.kind} at {r.fork.name} -> {r.join.name}: {parts}: {verdict}, {self.reason}"


@dataclass
class StreamPlan:
    """Stream of every node that leaves the main stream, with the reasons."""

    streams: int
    regions: list[RegionPlan] = field(default_factory=list)
    marked: dict[fx.Node, int] = field(default_factory=dict)

    def stream_of(self, node: fx.Node) -> int:
        """The stream ``node`` runs on (0 unless a split region or a mark says otherwise);
        for many nodes, read :attr:`assignment` once instead."""
        return self.assignment.get(node, 0)

    @property
    def assignment(self) -> dict[fx.Node, int]:
        out = {}
        for rp in self.regions:
            if rp.accepted:
                for bp in rp.branches:
                    out.update(dict.fromkeys(bp.branch.nodes, bp.stream))
        out.update(self.marked)
        return {n: s for n, s in out.items() if s}

    @property
    def gain_us(self) -> float:
        return sum(rp.gain_us for rp in self.regions)

    def summary(self) -> str:
        split = sum(rp.accepted for rp in self.regions)
        lines = [
            f"multi_stream plan, {self.streams} streams: {split} of {len(self.regions)} "
            f"regions split, ~{self.gain_us:.1f} us saved per call (cost model)"
        ]
        lines += [f"  {rp}" for rp in self.regions]
        if self.marked:
            lines.append(f"  {len(self.marked)} nodes marked by the user")
        return "\n".join(lines)

    __str__ = summary


# ----- one region ----------------------------------------------------------------------------
def _blocker(branch: Branch, members: set[fx.Node], memory: Memory) -> str:
    """Why this branch must keep its order (in-place writes others may see, effects)."""
    for node in branch.nodes:
        if is_random(node):
            return f"{node.name} draws random numbers"
        written = written_args(node)
        roots = {r for w in written for r in memory.roots(w)}
        if roots - members:
            outside = sorted(r.name for r in roots - members)
            return f"{node.name} writes {', '.join(outside)} in place"
        name = str(getattr(node.target, "__name__", node.target))
        harmless = name.startswith("_assert") or is_collective(node)  # collectives: pinned
        if not written and not harmless and node.is_impure():
            return f"{node.name} has side effects"
    return ""


def _assign(bps: list[BranchPlan], streams: int) -> list[float]:
    """Largest first, each to the least loaded stream; pinned branches on stream 0."""
    loads = [0.0] * streams
    for bp in bps:
        if bp.pinned:
            loads[0] += bp.cost_us
    for bp in sorted((b for b in bps if not b.pinned), key=lambda b: -b.cost_us):
        bp.stream = min(range(streams), key=lambda s: (loads[s], s))
        loads[bp.stream] += bp.cost_us
    return loads


def _plan_region(
    region: Region, streams: int, cost: CostModel, min_gain_us: float, memory: Memory
) -> RegionPlan:
    bps = [BranchPlan(b, cost.nodes_us(b.nodes)) for b in region.branches]
    rp = RegionPlan(region, bps, serial_us=sum(b.cost_us for b in bps))
    for bp in bps:
        members = set(bp.branch.nodes)
        blocker = _blocker(bp.branch, members, memory)
        if blocker:
            rp.parallel_us, rp.reason = rp.serial_us, f"keeps its order: {blocker}"
            return rp
        collective = next((n for n in bp.branch.nodes if is_collective(n)), None)
        if collective is not None:
            bp.pinned = f"collective {collective.name} stays on stream 0"
    loads = _assign(bps, streams)
    used = sum(1 for s in range(1, streams) if loads[s] > 0)
    rp.parallel_us = max(loads) + 2 * used * cost.event_us
    gain = rp.serial_us - rp.parallel_us
    if used and gain >= min_gain_us:
        rp.accepted = True
        rp.reason = f"saves ~{gain:.1f} us ({rp.serial_us:.1f} -> {rp.parallel_us:.1f})"
    else:
        for bp in bps:
            bp.stream = 0
        rp.reason = f"not worth it: gains {gain:.1f} us < min_gain_us={min_gain_us:g}"
    return rp


def _best(region: Region, streams, cost, min_gain_us, memory) -> list[RegionPlan]:
    """The best of: splitting ``region``, splitting the regions inside it, or both — the
    regions inside its main-stream branches moving work to the side streams' idle time."""
    rp = _plan_region(region, streams, cost, min_gain_us, memory)
    inner = [p for child in region.inner for p in _best(child, streams, cost, min_gain_us, memory)]
    inner_gain = sum(p.gain_us for p in inner)
    if not rp.accepted:
        return [rp, *inner]
    main = {n for bp in rp.branches if bp.stream == 0 for n in bp.branch.nodes}
    nested = [p for p in inner if p.accepted and set(p.region.nodes()) <= main]
    loads = [0.0] * streams
    for bp in rp.branches:
        loads[bp.stream] += bp.cost_us
    syncs = 2 * sum(1 for load in loads[1:] if load)
    for p in nested:
        for bp in p.branches:
            loads[0] -= bp.cost_us if bp.stream else 0.0
            loads[bp.stream] += bp.cost_us if bp.stream else 0.0
        syncs += 2 * len({bp.stream for bp in p.branches if bp.stream})
    both = rp.serial_us - max(loads) - syncs * cost.event_us if nested else 0.0
    if both > max(rp.gain_us, inner_gain):
        own = both - sum(p.gain_us for p in nested)  # the nested plans count their own gain
        rp.parallel_us = rp.serial_us - own
        rp.reason = f"saves ~{both:.1f} us with {len(nested)} regions inside it split too"
        return [rp, *nested]
    if rp.gain_us >= inner_gain:
        return [rp]
    rp.accepted = False
    for bp in rp.branches:
        bp.stream = 0
    rp.reason = f"regions inside it save more (~{inner_gain:.1f} us)"
    return [rp, *inner]


# ----- user marks ------------------------------------------------------------------------------
def _marks(graph: fx.Graph, streams: int, side: Sequence[str]) -> dict[fx.Node, int]:
    marked: dict[fx.Node, int] = {}
    for node in graph.nodes:
        own = node.meta.get("stream")
        if isinstance(own, int) and not isinstance(own, bool) and own >= 0:
            marked[node] = own
            continue
        if not side or streams < 2 or node.op not in ("call_function", "call_method"):
            continue
        paths = [
            str(v[0] if isinstance(v, tuple) else v)
            for v in (node.meta.get("nn_module_stack") or {}).values()
        ]
        for i, pattern in enumerate(side):
            if any(fnmatch.fnmatchcase(p, pattern) for p in paths):
                if not is_collective(node):
                    marked[node] = 1 + i % (streams - 1)
                break
    return marked


def plan_streams(
    gm: fx.GraphModule,
    *,
    streams: int = 2,
    cost: CostModel | None = None,
    min_gain_us: float = 1.0,
    side: Sequence[str] = (),
    memory: Memory | None = None,
) -> StreamPlan:
    """Decide which nodes of ``gm`` run on which of ``streams`` streams (nothing is changed).

    >>> print(plan_streams(gm, streams=2))                       # doctest: +SKIP
    multi_stream plan, 2 streams: 2 of 4 regions split, ~23.0 us saved per call (cost model)
      moe at mul_3 -> add_7: routed experts (...) [0] 52.0 us | shared expert (...) [1] ...

    ``memory``: the graph's storage facts (:class:`~fxpass.edit.memory.Memory`), when the
    caller already has them.
    """
    if not isinstance(streams, int) or isinstance(streams, bool) or streams < 1:
        raise ValueError(
            f"streams must be a whole number >= 1 (1 keeps everything on the main stream), "
            f"got {streams!r}"
        )
    cost = cost or CostModel()
    plan = StreamPlan(streams)
    if streams > 1:
        memory = memory if memory is not None else Memory(gm.graph)
        for region in find_regions(gm):
            plan.regions += _best(region, streams, cost, min_gain_us, memory)
    plan.marked = _marks(gm.graph, streams, side)
    return plan
