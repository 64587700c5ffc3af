"""check_streams: safe schedules pass, and every planted error is caught and explained."""

from __future__ import annotations

import pytest
import torch
from _streams import repeat_kv_race, scheduled
from torch import fx

import fxpass as fp
from fxpass.ops.stream import is_stream_op
from fxpass.verify import StreamScheduleError, check_streams, require_safe_streams

OPS = torch.ops.fxpass


def _export(fn) -> fx.GraphModule:
    class M(torch.nn.Module):
        def forward(self, x, w):
            return fn(x, w)

    return torch.export.export(M(), (torch.randn(4, 8), torch.randn(8, 8))).graph_module


def _fork(x, w, *, wait=True, record_stream=True, join=True, back=True, wait_first=False):
    OPS.record_event(0, 0)
    OPS.set_stream(1)
    if wait:
        OPS.wait_event(0, 1)
    b = torch.mm(x, w)
    if wait_first:
        OPS.wait_event(1, 0)
    OPS.record_event(1, 1)
    if back:
        OPS.set_stream(0)
    a = x.sin()
    if join and not wait_first:
        OPS.wait_event(1, 0)
    out = a + b
    if record_stream:
        OPS.record_stream(b, 0)
    return out


def _kinds(gm) -> list[str]:
    return sorted({v.kind for v in check_streams(gm)})


def test_a_safe_hand_written_schedule_passes():
    assert check_streams(_export(_fork)) == []
    require_safe_streams(_export(_fork))


def test_a_graph_without_streams_is_safe():
    gm = _export(lambda x, w: torch.mm(x, w).relu())
    assert check_streams(gm) == []


def test_missing_wait_names_reader_and_producer():
    (v,) = check_streams(_export(lambda x, w: _fork(x, w, wait=False)))
    assert v.kind == "missing_sync" and v.nodes[:2] == ("mm", "x")
    assert "mm (stream 1) reads x, an input of the graph" in v.message
    assert "stream 1 never waits for stream 0 before mm" in v.message


def test_wait_before_its_record():
    gm = _export(lambda x, w: _fork(x, w, wait_first=True))
    violations = check_streams(gm)
    first = violations[0]
    assert first.kind == "wait_before_record"
    assert "wait for event 1 before any record_event of it" in first.message
    assert "record_event_1" in first.message  # the record that comes too late
    assert {"unjoined_output", "unjoined_stream"} & {v.kind for v in violations}


def test_cross_stream_tensor_freed_early():
    (v,) = check_streams(_export(lambda x, w: _fork(x, w, record_stream=False)))
    assert v.kind == "freed_early" and v.nodes == ("mm", "add", "add")
    assert "record_stream(mm, 0)" in v.message


def test_unjoined_output_and_stream():
    def returns_side_value(x, w):
        OPS.record_event(0, 0)
        OPS.set_stream(1)
        OPS.wait_event(0, 1)
        b = torch.mm(x, w)
        OPS.set_stream(0)
        return b

    assert _kinds(_export(returns_side_value)) == ["unjoined_output", "unjoined_stream"]
    assert _kinds(_export(lambda x, w: _fork(x, w, join=False))) == [
        "missing_sync",
        "unjoined_stream",
    ]


def test_graph_ending_on_a_side_stream():
    assert "ends_on_side_stream" in _kinds(_export(lambda x, w: _fork(x, w, back=False)))


def test_event_chains_through_a_third_stream_count():
    def chain(x, w):
        a = x.cos()
        OPS.record_event(0, 0)
        OPS.wait_event(0, 1)  # stream 1 is past `a` ...
        OPS.record_event(1, 1)
        OPS.set_stream(2)
        OPS.wait_event(1, 2)  # ... so stream 2, waiting for stream 1, is past it too
        b = torch.mm(a, w)
        OPS.record_event(2, 2)
        OPS.set_stream(0)
        OPS.wait_event(2, 0)
        out = a + b
        OPS.record_stream(b, 0)
        OPS.record_stream(a, 2)
        return out

    assert check_streams(_export(chain)) == []


def test_in_place_write_while_another_stream_reads():
    def race(x, w):
        t = x * 1
        OPS.record_event(0, 0)
        OPS.set_stream(1)
        OPS.wait_event(0, 1)
        b = torch.mm(t, w)
        OPS.record_event(1, 1)
        OPS.set_stream(0)
        t.add_(1)  # overwrites what stream 1 may still be reading
        OPS.wait_event(1, 0)
        OPS.record_stream(t, 1)
        OPS.record_stream(b, 0)
        return t + b

    v = next(v for v in check_streams(_export(race)) if v.kind == "missing_sync")
    assert "overwrites mul, which mm (stream 1) reads" in v.message


def test_meta_stream_that_disagrees_with_set_stream():
    gm = _export(_fork)
    node = next(n for n in gm.graph.nodes if n.name == "sin")
    node.meta["stream"] = 1
    (v,) = check_streams(gm)
    assert v.kind == "stream_mismatch" and "sin is marked for stream 1" in v.message


def test_graph_built_node_by_node():
    graph = fx.Graph()
    x = graph.placeholder("x")
    graph.call_function(OPS.set_stream.default, (1,))
    y = graph.call_function(torch.ops.aten.relu.default, (x,))
    graph.call_function(OPS.record_event.default, (0, 1))
    graph.call_function(OPS.set_stream.default, (0,))
    graph.call_function(OPS.wait_event.default, (0, 0))
    graph.output(y)
    (v,) = check_streams(graph)  # stream 1 never waited for the input
    assert v.kind == "missing_sync" and v.nodes[:2] == ("relu_default", "x")
    graph.call_function(OPS.set_stream.default, (x,))  # not a constant
    assert "bad_stream_op" in {v.kind for v in check_streams(graph)}


# ----- planted errors in a real schedule (the MoE decoder, two streams) ---------------------
def _stream_nodes(gm, op):
    return [n for n in gm.graph.nodes if is_stream_op(n) and n.target is op]


def test_scheduled_moe_decoder_is_safe():
    gm, _ = scheduled("moe")
    assert check_streams(gm) == []


def test_planted_missing_wait():
    gm, _ = scheduled("moe")
    gm.graph.erase_node(_stream_nodes(gm, OPS.wait_event.default)[0])
    assert "missing_sync" in _kinds(gm)


def test_planted_wait_before_its_record():
    gm, _ = scheduled("moe")
    wait = _stream_nodes(gm, OPS.wait_event.default)[1]
    record = next(
        r for r in _stream_nodes(gm, OPS.record_event.default) if r.args[0] == wait.args[0]
    )
    record.prepend(wait)
    kinds = _kinds(gm)
    assert "wait_before_record" in kinds and "missing_sync" in kinds


def test_planted_tensor_freed_early():
    gm, _ = scheduled("moe")
    keep = _stream_nodes(gm, OPS.record_stream.default)[0]
    tensor = keep.args[0].name
    gm.graph.erase_node(keep)
    violations = check_streams(gm)
    assert {v.kind for v in violations} == {"freed_early"}
    assert f"record_stream({tensor}, " in violations[0].message


def test_planted_unjoined_output():
    gm, _ = scheduled("moe")
    output = next(n for n in gm.graph.nodes if n.op == "output")
    last_wait = _stream_nodes(gm, OPS.wait_event.default)[-1]
    gm.graph.erase_node(last_wait)
    assert output.prev is not last_wait
    assert {"unjoined_stream"} <= set(_kinds(gm)) or {"unjoined_output"} <= set(_kinds(gm))


def test_require_safe_streams_raises_with_every_violation():
    gm, _ = scheduled("moe")
    for wait in _stream_nodes(gm, OPS.wait_event.default):
        gm.graph.erase_node(wait)
    with pytest.raises(StreamScheduleError, match=r"unsafe spots in the stream schedule"):
        require_safe_streams(gm)
    assert fp.verify.require_safe_streams is require_safe_streams


# ----- issue 19: a reshape of an expand copies ------------------------------------------------
def test_issue_19_a_copying_reshape_after_its_event_is_a_race():
    gm, _ = repeat_kv_race(fixed=False)
    reshape = next(n for n in gm.graph.nodes if n.target is torch.ops.aten.reshape.default)
    assert reshape.args[0].target is torch.ops.aten.expand.default
    v, unjoined = check_streams(gm)  # (the copy is also the side stream's last, unjoined work)
    assert unjoined.kind == "unjoined_stream" and unjoined.nodes == ("reshape",)
    assert v.kind == "missing_sync" and v.nodes[:2] == ("scaled_dot_product_attention", "reshape")
    assert "reads reshape, which reshape (stream 1) wrote" in v.message
    assert "(wait_event_1) is for record_event_1, too early" in v.message
    fixed, _ = repeat_kv_race(fixed=True)
    assert check_streams(fixed) == []
