"""Stream ops: which stream runs the next kernels, and the CUDA events that order streams.

=================================  ==============================================================
op                                 what it does on CUDA (on every other device: nothing)
=================================  ==============================================================
``fxpass::set_stream(int stream)``  make ``stream`` current: the kernels after it run there
``fxpass::record_event(int event,   record ``event`` on ``stream``: it completes when the work
int stream)``                       queued on ``stream`` so far completes
``fxpass::wait_event(int event,     make ``stream`` wait for the last record of ``event`` before
int stream)``                       running what is queued on it next
``fxpass::record_stream(Tensor t,   tell the caching allocator that ``stream`` uses ``t``: its
int stream)``                       memory is not reused until that work is done
=================================  ==============================================================

Streams and events are small integers. Stream ``0`` is the *main* stream: the stream that was
current when the graph started (under CUDA-graph capture, the capture stream), and
``set_stream(0)`` goes back to it. Other numbers name side streams, and event numbers name
events, from a table per process and thread (per device), created on first use. All four return nothing
and are registered as side-effectful (``torch.fx.node.has_side_effect``), so no dead-code
elimination removes them. Tracing (``torch.export``, ``run_decompositions``, ``make_fx``)
replays a graph in order, so they keep their place there and in saved ``.pt2`` files.

Inductor would not keep them in place: it schedules ops that return nothing ahead of the
kernels around them and fuses kernels across them. So ``torch.compile`` never puts them in a
graph: Dynamo breaks the graph at each one (``torch._dynamo.disallow_in_graph``), compiles
the pieces between them and runs them, in order, in between (``fullgraph=True`` refuses a
scheduled graph). Strict (Dynamo-based) ``torch.export`` refuses them for the same reason;
the default, non-strict export records them.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import sys
import threading
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, fx
from torch.fx.node import has_side_effect

__all__ = [
    "STREAM_OPS",
    "is_stream_op",
    "record_event",
    "record_stream",
    "reset_streams",
    "set_stream",
    "stream_op",
    "stream_trace",
    "wait_event",
]


# ----- the per-process table of CUDA streams and events ------------------------------------
class _State(threading.local):
    """Per thread, so that threads running scheduled graphs at once do not share events."""

    def __init__(self) -> None:
        self.main: Any = None  # the stream to go back to, while a side stream is current
        self.trace: list[tuple[Any, ...]] | None = None
        self.streams: dict[tuple[int, int], Any] = {}  # (device, number) -> side stream
        self.events: dict[tuple[int, int], Any] = {}  # (device, number) -> event


_STATE = _State()


def _on_cuda() -> bool:
    """Act on CUDA only when the process already uses it (a CPU model stays CPU-only)."""
    return torch.cuda.is_available() and torch.cuda.is_initialized()


def _cuda_stream(stream: int) -> Any:
    if stream == 0:
        return _STATE.main if _STATE.main is not None else torch.cuda.current_stream()
    key = (torch.cuda.current_device(), stream)
    if key not in _STATE.streams:
        _STATE.streams[key] = torch.cuda.Stream()
    return _STATE.streams[key]


def _cuda_event(event: int) -> Any:
    key = (torch.cuda.current_device(), event)
    if key not in _STATE.events:
        _STATE.events[key] = torch.cuda.Event()
    return _STATE.events[key]


def reset_streams() -> None:
    """Go back to the main stream and forget this thread's side streams and events (after a
    scheduled graph raised halfway, a side stream may still be current)."""
    if _STATE.main is not None and _on_cuda():
        torch.cuda.set_stream(_STATE.main)
    _STATE.main = None
    _STATE.streams.clear()
    _STATE.events.clear()


@contextlib.contextmanager
def stream_trace() -> Iterator[list[tuple[Any, ...]]]:
    """Record every stream op that runs inside the block, in order: ``(name, *ints)``.

    >>> with stream_trace() as calls:                             # doctest: +SKIP
    ...     scheduled(*inputs)
    >>> calls[:2]                                                 # doctest: +SKIP
    [('record_event', 0, 0), ('set_stream', 1)]
    """
    outer = _STATE.trace
    _STATE.trace = calls = []
    try:
        yield calls
    finally:
        _STATE.trace = outer


def _note(*call: Any) -> None:
    if _STATE.trace is not None:
        _STATE.trace.append(call)


def _check_ids(op: str, **ids: int) -> None:
    for name, value in ids.items():
        torch._check(
            value >= 0,
            lambda name=name, value=value: (
                f"fxpass.{op}: {name} must be a number >= 0 (0 is the main stream), got {value}"
            ),
        )


# ----- fxpass::set_stream ----------------------------------------------------------------------
@torch.library.custom_op("fxpass::set_stream", mutates_args=(), schema="(int stream) -> ()")
def set_stream(stream: int) -> None:
    """Make ``stream`` the current stream (0: back to the main stream)."""
    _check_ids("set_stream", stream=stream)
    _note("set_stream", stream)
    if not _on_cuda():
        return
    if stream == 0:
        if _STATE.main is not None:
            torch.cuda.set_stream(_STATE.main)
            _STATE.main = None
        return
    if _STATE.main is None:
        _STATE.main = torch.cuda.current_stream()
    torch.cuda.set_stream(_cuda_stream(stream))


@set_stream.register_fake
def _(stream):
    _check_ids("set_stream", stream=stream)


# ----- fxpass::record_event --------------------------------------------------------------------
@torch.library.custom_op(
    "fxpass::record_event", mutates_args=(), schema="(int event, int stream) -> ()"
)
def record_event(event: int, stream: int) -> None:
    """Record ``event`` on ``stream``."""
    _check_ids("record_event", event=event, stream=stream)
    _note("record_event", event, stream)
    if _on_cuda():
        _cuda_event(event).record(_cuda_stream(stream))


@record_event.register_fake
def _(event, stream):
    _check_ids("record_event", event=event, stream=stream)


# ----- fxpass::wait_event ----------------------------------------------------------------------
@torch.library.custom_op(
    "fxpass::wait_event", mutates_args=(), schema="(int event, int stream) -> ()"
)
def wait_event(event: int, stream: int) -> None:
    """Make ``stream`` wait for the last record of ``event``."""
    _check_ids("wait_event", event=event, stream=stream)
    _note("wait_event", event, stream)
    if _on_cuda():
        _cuda_event(event).wait(_cuda_stream(stream))


@wait_event.register_fake
def _(event, stream):
    _check_ids("wait_event", event=event, stream=stream)


# ----- fxpass::record_stream -------------------------------------------------------------------
@torch.library.custom_op(
    "fxpass::record_stream", mutates_args=(), schema="(Tensor t, int stream) -> ()"
)
def record_stream(t: Tensor, stream: int) -> None:
    """Keep ``t``'s memory from reuse until the work queued on ``stream`` so far is done."""
    _check_ids("record_stream", stream=stream)
    _note("record_stream", stream)


@record_stream.register_kernel("cuda")
def _(t, stream):
    _check_ids("record_stream", stream=stream)
    _note("record_stream", stream)
    t.record_stream(_cuda_stream(stream))


@record_stream.register_fake
def _(t, stream):
    _check_ids("record_stream", stream=stream)


#: The stream ops' overloads (what graph nodes call).
STREAM_OPS = frozenset(
    {
        torch.ops.fxpass.set_stream.default,
        torch.ops.fxpass.record_event.default,
        torch.ops.fxpass.wait_event.default,
        torch.ops.fxpass.record_stream.default,
    }
)
for _op in STREAM_OPS:
    has_side_effect(_op)


def _keep_out_of_compiled_graphs() -> None:
    """torch.compile runs the stream ops between compiled graphs, in order: Inductor would
    hoist them above the kernels they separate and fuse kernels across them."""
    import torch._dynamo

    for op in STREAM_OPS:
        torch._dynamo.disallow_in_graph(op)
        torch._dynamo.disallow_in_graph(op.overloadpacket)


warnings.filterwarnings(  # Dynamo explains each such graph break once, as if it were a bug
    "ignore", message=r"(?s)Dynamo does not know how to trace the builtin `torch\._ops\.fxpass\."
)


class _WhenDynamoLoads(importlib.abc.MetaPathFinder):
    """Run :func:`_keep_out_of_compiled_graphs` as soon as ``torch._dynamo`` is imported:
    importing it here would add about a second to ``import fxpass``."""

    def find_spec(self, fullname, path, target=None):
        if fullname != "torch._dynamo":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _keep_out_of_compiled_graphs()

        spec.loader.exec_module = exec_module
        return spec


if "torch._dynamo" in sys.modules:
    _keep_out_of_compiled_graphs()
else:
    sys.meta_path.insert(0, _WhenDynamoLoads())


def stream_op(node: Any) -> Any:
    """The stream op overload ``node`` calls (``torch.ops.fxpass.set_stream`` and
    ``torch.ops.fxpass.set_stream.default`` alike), or None."""
    if not isinstance(node, fx.Node) or node.op != "call_function":
        return None
    target = node.target
    if isinstance(target, torch._ops.OpOverloadPacket) and target._qualified_op_name.startswith(
        "fxpass::"
    ):
        target = target.default
    return target if target in STREAM_OPS else None


def is_stream_op(node: Any) -> bool:
    """Whether ``node`` is a call of one of the stream ops."""
    return stream_op(node) is not None
