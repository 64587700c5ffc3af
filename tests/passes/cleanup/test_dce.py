"""dce: dead code goes, effects stay."""

from __future__ import annotations

import pytest
import torch
from _cleanup_helpers import calls

import fxpass as fp
from fxpass.verify.testing import capture, check_pass

from _models import ASSERT, count, exported_gm


class _Dead(torch.nn.Module):
    def forward(self, x):
        x.sin()  # dead
        torch.rand(3)  # dead, but it advances the generator
        t = x * 2
        t.add_(1)  # a dead store: t is never read again
        return (x.cos() + 1,)


@pytest.mark.parametrize("how", ["dynamo", "trace"])
def test_drops_dead_values_and_dead_stores_keeps_random_ops(how):
    check = check_pass(
        "dce",
        _Dead(),
        (torch.randn(4),),
        capture_with=how,
        modified=True,
    )
    gm = check.graph_module
    assert calls(gm, "sin") == calls(gm, "add_") == calls(gm, "mul") == 0
    assert calls(gm, "cos") == 1
    if how == "dynamo":
        assert calls(gm, "rand") == 1
    assert check.report.root.children[0].stats == {"removed": 3}


def test_keep_rng_false_drops_unused_random_ops():
    c = capture(_Dead(), (torch.randn(4),), "aot")
    assert count(c.graph_module, torch.ops.aten.rand.default) == 1
    fp.Pipeline.parse("dce{keep_rng=false}").run(c.graph_module)
    assert count(c.graph_module, torch.ops.aten.rand.default) == 0


class _Writes(torch.nn.Module):
    def forward(self, x, buf):
        buf.add_(1)  # writes an input: the caller sees it
        t = x * 2
        v = t.view(-1)
        t.mul_(3)  # read afterwards through the view
        return (v.sum(),)


def test_writes_the_caller_or_a_later_read_can_see_stay():
    c = capture(_Writes(), (torch.randn(4), torch.zeros(4)), "dynamo")
    result = fp.Pipeline.parse("dce").run(c.graph_module)
    assert calls(c.graph_module, "add_") == calls(c.graph_module, "mul_") == 1
    assert result.modified is False


def test_export_asserts_are_effects():
    gm = exported_gm(layers=1)
    asserts = count(gm, ASSERT)
    assert asserts > 0
    result = fp.Pipeline.parse("dce").run(gm)
    assert count(gm, ASSERT) == asserts and result.modified is False


def test_debug_counter_limits_the_removals():
    c = capture(_Dead(), (torch.randn(4),), "trace")
    fp.Pipeline.parse("dce").run(c.graph_module, debug_counter=fp.core.DebugCounter(count=1))
    gm = c.graph_module
    assert calls(gm, "sin") + calls(gm, "add_") + calls(gm, "mul") == 2  # one of three went
