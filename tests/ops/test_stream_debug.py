"""stream_debug: safe schedules give exact outputs on CPU, and every planted race gives wrong
ones — deterministically."""

from __future__ import annotations

import pytest
import torch
from _streams import (
    FAULTS,
    HF_MODELS,
    fault_sites,
    original,
    plant,
    random_dag,
    repeat_kv_race,
    same,
    scheduled,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fxpass.ops.stream import stream_trace
from fxpass.ops.stream_debug import stream_debug
from fxpass.streams import apply_plan, plan_streams

OPS = torch.ops.fxpass


def _run(gm, inputs, hold: str):
    with stream_debug(hold) as debug:
        out = gm(*inputs)
    return out, debug


def _fork(x, w, *, wait=True, join=True, keep=True, early=False):
    OPS.record_event(0, 0)
    OPS.set_stream(1)
    if wait:
        OPS.wait_event(0, 1)
    if early:
        OPS.record_event(1, 1)
    b = torch.mm(x, w).relu()
    if not early:
        OPS.record_event(1, 1)
    OPS.set_stream(0)
    a = x.sin() * 2
    if join:
        OPS.wait_event(1, 0)
    out = a + b
    if keep:
        OPS.record_stream(b, 0)
    return out


class _Fork(torch.nn.Module):
    def __init__(self, **faults) -> None:
        super().__init__()
        self.faults = faults

    def forward(self, x, w):
        return _fork(x, w, **self.faults)


def _inputs():
    g = torch.Generator().manual_seed(0)
    return torch.randn(4, 8, generator=g), torch.randn(8, 8, generator=g)


@pytest.mark.parametrize(
    "faults, hold, stale",
    [
        ({}, None, ""),
        ({"wait": False}, "main", "read an input before the main stream's work on it"),
        ({"join": False}, "side", "read what aten.relu.default (stream 1) had not written"),
        ({"early": True}, "side", "read what aten.relu.default (stream 1) had not written"),
        ({"keep": False}, "main", "freed and the allocator had handed out again"),
    ],
)
def test_each_race_of_a_hand_written_schedule_gives_wrong_outputs(faults, hold, stale):
    x, w = _inputs()
    want = x.sin() * 2 + torch.mm(x, w).relu()
    gm = torch.export.export(_Fork(**faults), (x, w)).module()
    for h in ("side", "main"):
        got, debug = _run(gm, (x, w), h)
        assert torch.equal(got, want) == (h != hold), h
        assert bool(debug.stale_reads) == (h == hold)
        if h == hold:
            assert stale in debug.stale_reads[0] and torch.isnan(got).any()
    assert torch.equal(gm(x, w), want)  # outside the block: ordinary eager


def test_stream_ops_are_traced_and_checked_as_usual():
    x, w = _inputs()
    with stream_trace() as calls, stream_debug():
        _Fork()(x, w)
    assert calls[:3] == [("record_event", 0, 0), ("set_stream", 1), ("wait_event", 0, 1)]
    with pytest.raises(RuntimeError, match=r"must be a number >= 0"), stream_debug():
        OPS.set_stream(-1)
    with pytest.raises(ValueError, match="hold must be 'side' or 'main', not 'both'"):
        stream_debug("both")


@pytest.mark.parametrize("name", ["moe", "mixtral"])
def test_the_pass_schedules_give_exact_outputs(name):
    gm, _ = scheduled(name)
    before, inputs = original(name)
    want = before(*inputs)
    for hold in ("side", "main"):
        got, debug = _run(gm, inputs, hold)
        assert same(got, want) and debug.stale_reads == [] and debug.kernels > 50


@pytest.mark.parametrize("name", ["moe", "mixtral"])
def test_planted_faults_are_seen_and_give_wrong_outputs(name):
    """Every planted race is seen (a stale read under one of the holds); each kind gives
    wrong outputs somewhere. (Some races cannot change the outputs at all: a ``full_like``
    whose values ``where`` never selects, an index into a dimension of size one.)"""
    before, inputs = original(name)
    want = before(*inputs)
    for kind in FAULTS:
        sites = fault_sites(scheduled(name)[0], kind)
        assert sites or (kind == "copy_past_record" and name not in HF_MODELS)
        wrong = 0
        spread = {0, sites // 2, sites - 1} if name in HF_MODELS else {0}
        for index in sorted(spread if sites else set()):
            gm, _ = scheduled(name)
            what = plant(gm, kind, index)
            runs = [_run(gm, inputs, h) for h in ("side", "main")]
            assert any(debug.stale_reads for _, debug in runs), f"{name}: {what} unseen"
            wrong += any(not same(out, want) for out, _ in runs)
        assert wrong or not sites, f"{name}: no {kind} gave wrong outputs"


def test_the_same_race_gives_the_same_wrong_numbers_every_time():
    gm, _ = scheduled("mixtral")
    _, inputs = original("mixtral")
    plant(gm, "copy_past_record")
    first, debug = _run(gm, inputs, "side")
    second, _ = _run(gm, inputs, "side")
    assert not same(first, original("mixtral")[0](*inputs))
    for a, b in zip(first, second):
        assert torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0))
    assert "aten.clone.default (stream 1) had not written yet" in debug.stale_reads[0]


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_graphs_scheduled_by_the_pass_give_exact_outputs(data):
    gm, inputs = random_dag(data.draw, st)
    want = gm(*inputs)
    apply_plan(gm, plan_streams(gm, streams=3, min_gain_us=1e9))
    gm.recompile()
    for hold in ("side", "main"):
        got, debug = _run(gm, inputs, hold)
        assert same(got, want) and debug.stale_reads == []


def test_the_issue_19_schedule_gives_wrong_outputs_and_its_fix_does_not():
    race, inputs = repeat_kv_race()
    fixed, _ = repeat_kv_race(fixed=True)
    want = fixed(*inputs)
    assert same(race(*inputs), want)  # on CPU, without the debug mode: no sign of it
    got, debug = _run(race, inputs, "side")
    assert not same(got, want) and len(debug.stale_reads) == 1
    assert "had not written yet" in debug.stale_reads[0]
    got, debug = _run(fixed, inputs, "side")
    assert same(got, want) and debug.stale_reads == []
