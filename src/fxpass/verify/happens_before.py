"""What happens before what on several streams: a vector clock per stream, events as edges.

A multi-stream schedule (:mod:`fxpass.ops.stream`) runs like this: nodes are issued in graph
order; each kernel goes to the current stream (``set_stream``; stream 0 at the start);
``record_event(e, s)`` marks how far stream ``s`` has got, ``wait_event(e, s)`` makes
stream ``s`` wait for the last record of ``e``. Otherwise streams run concurrently.

:class:`StreamClocks` replays that: each stream keeps a vector clock (how far it knows every
stream has got); a kernel ticks its stream's own entry; a record snapshots the recording
stream's clock, a wait merges the snapshot into the waiting stream's. Kernel ``k`` (tick
``t`` on stream ``a``) happens before whatever stream ``b`` runs next exactly when
``clocks.covers(b, a, t)``, through any chain of events. The checker
(:func:`~fxpass.verify.check_streams`) and the scheduling pass (:mod:`fxpass.streams`) both
replay with it, so they agree on what "ordered" means.

>>> clocks = StreamClocks()
>>> t = clocks.tick(1)                          # a kernel on stream 1
>>> clocks.covers(0, 1, t)
False
>>> _ = clocks.record(0, 1); clocks.wait(0, 0)   # record on stream 1, wait on stream 0
True
>>> clocks.covers(0, 1, t)
True
"""

from __future__ import annotations

__all__ = ["GRAPH_START", "Clock", "StreamClocks"]

#: The tick of stream 0 at which the caller's tensors (inputs, parameters) were written.
GRAPH_START = 1

Clock = dict[int, int]  # stream -> how far it has got


class StreamClocks:
    """The vector clocks of a replay, and the last snapshot recorded for each event."""

    __slots__ = ("clocks", "current", "events")

    def __init__(self) -> None:
        self.current = 0
        self.clocks: dict[int, Clock] = {0: {0: GRAPH_START}}
        self.events: dict[int, Clock] = {}

    def clock(self, stream: int) -> Clock:
        """``stream``'s vector clock (live: do not keep it across ticks, copy it)."""
        return self.clocks.setdefault(stream, {})

    def tick(self, stream: int) -> int:
        """A kernel runs on ``stream``: its tick there."""
        clock = self.clock(stream)
        clock[stream] = clock.get(stream, 0) + 1
        return clock[stream]

    def now(self, stream: int) -> int:
        """How many kernels ``stream`` has run (its last tick)."""
        return self.clock(stream).get(stream, 0)

    def covers(self, stream: int, other: int, tick: int) -> bool:
        """Does what ``stream`` runs next happen after ``other``'s work up to ``tick``?"""
        return self.clock(stream).get(other, 0) >= tick

    def record(self, event: int, stream: int) -> Clock:
        """``record_event(event, stream)``: the snapshot a wait for ``event`` will get."""
        snapshot = dict(self.clock(stream))
        self.events[event] = snapshot
        return snapshot

    def merge(self, stream: int, snapshot: Clock) -> None:
        """Make ``stream`` know everything ``snapshot`` knows."""
        clock = self.clock(stream)
        for s, t in snapshot.items():
            if t > clock.get(s, 0):
                clock[s] = t

    def wait(self, event: int, stream: int) -> bool:
        """``wait_event(event, stream)``; False when ``event`` was never recorded (then the
        wait waits for nothing)."""
        snapshot = self.events.get(event)
        if snapshot is None:
            return False
        self.merge(stream, snapshot)
        return True
