"""``multi_stream``: run independent work on several CUDA streams, with an event for every
cross-stream dependency, and prove the schedule safe.

Before / after (an MoE block's shared expert moved to stream 1; names shortened)::

    %h = rms_norm(%x)                      %h = rms_norm(%x)
    %router = mm(%h, %w_gate)              %record_event = fxpass.record_event(0, 0)
    ...routed experts...                   %set_stream = fxpass.set_stream(1)
    %shared = mm(%h, %w_shared)            %wait_event = fxpass.wait_event(0, 1)
    ...                                    %shared = mm(%h, %w_shared)        # stream 1
    %out = add(%routed, %shared)           ...
                                           %record_event_1 = fxpass.record_event(1, 1)
                                           %set_stream_1 = fxpass.set_stream(0)
                                           %router = mm(%h, %w_gate)          # stream 0
                                           ...routed experts...
                                           %wait_event_1 = fxpass.wait_event(1, 0)
                                           %out = add(%routed, %shared)
                                           %record_stream = fxpass.record_stream(%shared, 0)

The pass plans with :func:`~fxpass.streams.plan_streams` (independent regions, the cost
model, the ``streams`` knob), rewrites with :func:`~fxpass.streams.apply_plan`, and installs
:func:`~fxpass.verify.require_safe_streams` as an invariant of the run: it is checked after
this pass and after every later pass of the same pipeline, so a later pass that breaks the
schedule fails (and the pipeline rolls back) instead of racing on the GPU. It preserves the
``stream_assignment`` analysis (:mod:`fxpass.verify.stream_assignment`): its own last check
asked for it on the finished graph, so the invariant and later passes are served that one.
"""

from __future__ import annotations

from torch import fx

from ..core.context import PassContext
from ..core.pass_registry import register
from ..edit.memory import Memory
from ..ops.stream import is_stream_op
from ..verify.stream_assignment import stream_assignment
from ..verify.streams import require_safe_streams
from .assignment import plan_streams
from .cost import CostModel
from .schedule import apply_plan

__all__ = ["multi_stream"]


@register(
    "multi_stream",
    origin="fxpass",
    keeps=("val", "stack_trace", "nn_module_stack", "provenance", "stream"),
    statistics={
        "regions": "independent regions found",
        "regions_split": "regions the cost model put on several streams",
        "side_kernels": "kernels moved to a side stream",
        "events": "events recorded",
        "waits": "waits inserted (each needed by a dependency, none implied by another)",
        "record_streams": "tensors kept alive for a stream that reads them",
        "gain_us": "estimated microseconds saved per call",
        "already_scheduled": "graphs left alone because they had stream ops",
    },
)
def multi_stream(
    gm: fx.GraphModule,
    ctx: PassContext,
    *,
    streams: int = 2,
    min_gain_us: float = 1.0,
    side: list[str] | None = None,
    peak_tflops: float = 400.0,
    bandwidth_gbs: float = 2000.0,
    kernel_us: float = 2.0,
    event_us: float = 1.0,
) -> bool:
    """Overlap independent work on ``streams`` CUDA streams where the cost model says it pays.

    Options: ``streams`` (how many, the main one included), ``min_gain_us`` (the least
    estimated saving for a region to be split), ``side`` (module-path patterns whose nodes
    go to a side stream, e.g. ``["*.shared_expert"]``), and the cost model's device:
    ``peak_tflops``, ``bandwidth_gbs``, ``kernel_us`` (a kernel's least time), ``event_us``
    (one record + wait). A graph that already has stream ops is left alone.
    """
    if any(is_stream_op(n) for n in gm.graph.nodes):
        ctx.stat("already_scheduled")
        return False
    cost = CostModel(
        peak_flops=peak_tflops * 1e12,
        bandwidth=bandwidth_gbs * 1e9,
        kernel_us=kernel_us,
        event_us=event_us,
    )
    memory = Memory(gm.graph)  # what each node does with memory: once, for the whole pass
    plan = plan_streams(
        gm, streams=streams, cost=cost, min_gain_us=min_gain_us, side=side or (), memory=memory
    )
    ctx.stat("regions", len(plan.regions))
    ctx.stat("regions_split", sum(rp.accepted for rp in plan.regions))
    editor = ctx.editor
    if not plan.assignment or not editor.allow():  # the schedule is one change: all or none
        return False
    stats = apply_plan(gm, plan, memory=memory, editor=editor)
    ctx.stat("side_kernels", stats.side_kernels)
    ctx.stat("events", stats.events)
    ctx.stat("waits", stats.waits)
    ctx.stat("record_streams", stats.record_streams)
    ctx.stat("gain_us", round(plan.gain_us, 1))
    ctx.analyses.preserve(stream_assignment)  # apply_plan's last check asked for it
    return True


multi_stream.invariants = (require_safe_streams,)
