"""plan_streams: the cost model decides, collectives stay home, effects keep their order."""

from __future__ import annotations

import pytest
import torch
from _streams import original
from torch import fx

from fxpass.streams import plan_streams

aten = torch.ops.aten


def _export(fn, *inputs) -> fx.GraphModule:
    class M(torch.nn.Module):
        def forward(self, *args):
            return fn(*args)

    return torch.export.export(M(), inputs).graph_module


def test_moe_shared_expert_goes_to_the_second_stream():
    gm, _ = original("moe")
    plan = plan_streams(gm, streams=2)
    moe = [rp for rp in plan.regions if rp.region.kind == "moe"]
    assert moe and all(rp.accepted for rp in moe)
    for rp in moe:
        routed, shared = rp.branches
        assert (routed.stream, shared.stream) == (0, 1)
        assert rp.gain_us > 0 and rp.parallel_us < rp.serial_us
    assert "moe at" in plan.summary() and "split" in plan.summary()


def test_not_worth_it_stays_on_the_main_stream():
    gm, _ = original("moe")
    plan = plan_streams(gm, streams=2, min_gain_us=1e6)
    assert plan.regions and not any(rp.accepted for rp in plan.regions)
    assert plan.assignment == {}
    assert "not worth it" in plan.summary()
    assert plan_streams(gm, streams=1).regions == []


@pytest.mark.parametrize("streams", [0, -1, 1.5, True])
def test_bad_stream_counts_are_refused(streams):
    gm, _ = original("moe")
    with pytest.raises(ValueError, match="streams must be a whole number >= 1"):
        plan_streams(gm, streams=streams)


def _with_collective() -> fx.GraphModule:
    graph = fx.Graph()
    x = graph.placeholder("x")
    a = x
    for _ in range(4):  # the bigger branch
        a = graph.call_function(aten.relu.default, (a,))
    r = graph.call_function(torch.ops._c10d_functional.all_reduce.default, (x, "sum", "0"))
    r = graph.call_function(torch.ops._c10d_functional.wait_tensor.default, (r,))
    graph.output(graph.call_function(aten.add.Tensor, (a, r)))
    return fx.GraphModule(torch.nn.Module(), graph)


def test_a_branch_with_a_collective_stays_on_stream_0():
    (rp,) = plan_streams(_with_collective()).regions
    relus, collective = rp.branches
    assert rp.accepted and collective.stream == 0 and relus.stream == 1
    assert collective.pinned.startswith("collective all_reduce")


def test_in_place_writes_others_may_see_keep_the_region_in_order():
    def writes_input(x, w):
        a = torch.mm(x, w).relu().exp()
        x.mul_(2)  # the caller's tensor
        return a + x.sum()

    (rp,) = plan_streams(_export(writes_input, torch.randn(4, 4), torch.randn(4, 4))).regions
    assert not rp.accepted and "mul_ writes args_0 in place" in rp.reason

    def writes_its_own(x, w):
        a = torch.mm(x, w).relu().exp()
        t = x * 2
        t.add_(1)  # memory only this branch sees: proven safe
        return a + t.sum()

    (rp,) = plan_streams(_export(writes_its_own, torch.randn(4, 4), torch.randn(4, 4))).regions
    assert rp.accepted


def test_random_ops_keep_the_region_in_order():
    def draws(x):
        return torch.rand_like(x).relu().exp() + x.sin().cos()

    (rp,) = plan_streams(_export(draws, torch.randn(4))).regions
    assert not rp.accepted and "draws random numbers" in rp.reason


def test_user_marked_modules_go_to_a_side_stream():
    gm, _ = original("moe")
    plan = plan_streams(gm, streams=3, min_gain_us=1e6, side=["*.shared_expert", "*.experts.0"])
    streams = {
        s: {n for n, t in plan.assignment.items() if t == s} for s in set(plan.assignment.values())
    }
    assert sorted(streams) == [1, 2] and all(len(v) >= 5 for v in streams.values())
    assert all(n.target is not torch.ops.aten.topk.default for n in plan.assignment)
