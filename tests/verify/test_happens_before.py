"""StreamClocks: ticks, records, waits and chains through streams."""

from __future__ import annotations

from fxpass.verify.happens_before import GRAPH_START, StreamClocks


def test_the_caller_work_is_on_stream_0_before_the_graph():
    clocks = StreamClocks()
    assert clocks.covers(0, 0, GRAPH_START) and not clocks.covers(1, 0, GRAPH_START)
    assert clocks.now(0) == GRAPH_START and clocks.now(1) == 0


def test_a_wait_sees_the_record_not_what_came_after_it():
    clocks = StreamClocks()
    first = clocks.tick(1)
    clocks.record(5, 1)
    second = clocks.tick(1)
    assert clocks.wait(5, 0)
    assert clocks.covers(0, 1, first) and not clocks.covers(0, 1, second)
    clocks.record(5, 1)  # recorded again: a later wait gets the later snapshot
    assert clocks.wait(5, 0) and clocks.covers(0, 1, second)


def test_chains_through_a_third_stream_and_waits_for_nothing():
    clocks = StreamClocks()
    a = clocks.tick(0)
    clocks.record(0, 0)
    clocks.wait(0, 1)
    clocks.tick(1)
    clocks.record(1, 1)
    clocks.wait(1, 2)
    assert clocks.covers(2, 0, a)  # through stream 1
    assert not clocks.wait(9, 2)  # never recorded
