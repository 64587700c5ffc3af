"""Multi-stream scheduling: find independent work, decide what is worth a second stream, and
rewrite the graph with stream and event ops that :func:`fxpass.verify.check_streams` proves
safe.

>>> import fxpass as fp
>>> result = fp.apply(ep, "multi_stream{streams=2}")              # doctest: +SKIP
>>> fp.verify.check_streams(result.graph_module)                  # doctest: +SKIP
[]

One concept per module: :mod:`~fxpass.streams.regions` (independent regions of the dataflow
graph), :mod:`~fxpass.streams.cost` (FLOPs, bytes and microseconds per node),
:mod:`~fxpass.streams.assignment` (which branch goes to which stream),
:mod:`~fxpass.streams.schedule` (the rewrite), :mod:`~fxpass.streams.multi_stream` (the
registered pass). The report draws the streams as lanes (:mod:`fxpass.html.lanes`).
The ops themselves are in :mod:`fxpass.ops.stream`. See ``docs/streams.md``.
"""

from __future__ import annotations

from .assignment import BranchPlan, RegionPlan, StreamPlan, plan_streams
from .cost import CostModel, node_bytes, node_flops
from .multi_stream import multi_stream
from .regions import Branch, Region, find_regions
from .schedule import ScheduleStats, apply_plan

__all__ = [
    "Branch",
    "BranchPlan",
    "CostModel",
    "Region",
    "RegionPlan",
    "ScheduleStats",
    "StreamPlan",
    "apply_plan",
    "find_regions",
    "multi_stream",
    "node_bytes",
    "node_flops",
    "plan_streams",
]
