from __future__ import annotations

import math

import planted_passes
import pytest
import torch
from _verify_helpers import graph_and_inputs, program

import fxpass as fp
from fxpass.verify import bisect

aten = torch.ops.aten


def test_finds_the_planted_rewrite_in_a_graph_module():
    gm, inputs = graph_and_inputs()
    k = planted_passes.planted_index(gm)
    culprit = planted_passes.candidates(gm)[k - 1].name
    n = len(planted_passes.candidates(gm))
    code_before = gm.graph.python_code("self").src
    result = bisect(gm, "planted_passes:add_as_sub_neg", inputs)
    assert not result.ok
    assert result.first_bad_pass.name == "add_as_sub_neg"
    rw = result.rewrite
    assert (rw.index, rw.pass_index, rw.total, rw.pass_path) == (k, k, n, "add_as_sub_neg")
    assert rw.rule == planted_passes.RULE and rw.old == [culprit]
    assert rw.location.endswith("planted_passes.py:60")
    assert not result.rewrite_comparison.ok
    assert result.runs <= 3 + math.ceil(math.log2(n))  # binary search, not a scan
    assert gm.graph.python_code("self").src == code_before  # the target is not touched
    text = str(result)
    assert f"first bad rewrite: #{k} of {n} in the run, #{k} of pass add_as_sub_neg" in text
    assert culprit in text


def test_finds_it_in_an_exported_program_after_other_passes():
    ep = program()
    k = planted_passes.planted_index(ep.graph_module)
    result = bisect(ep, fp.Pipeline.parse("cse,planted_passes:add_as_sub_neg,dce"))
    assert result.rewrite.pass_index == k
    assert result.rewrite.index > k  # cse's rewrites were counted first
    assert result.to_dict()["rewrite"]["pass_path"] == "add_as_sub_neg"


def test_nothing_to_find():
    gm, inputs = graph_and_inputs()
    result = bisect(gm, "cse,dce", inputs)
    assert result.ok and result.runs == 1
    assert str(result).startswith("numerics hold after every pass of 'cse,dce'")


def _uncounted_bug(gm: torch.fx.GraphModule) -> bool:
    """Turn the first neg into abs, without asking ctx.allow()."""
    for node in gm.graph.nodes:
        if node.target is aten.neg.default:
            node.target = aten.abs.default
            return True
    return False


def test_a_breaking_pass_that_does_not_count_its_rewrites():
    gm, inputs = graph_and_inputs()
    result = bisect(gm, fp.Pipeline([_uncounted_bug]), inputs)
    assert not result.ok and result.rewrite is None
    assert result.first_bad_pass.name == "_uncounted_bug"
    assert "does not ask ctx.allow()" in result.note


def test_rejects_modules():
    with pytest.raises(TypeError, match="GraphModule or an ExportedProgram"):
        bisect(torch.nn.Linear(2, 2), "cse")


def test_a_wrong_rule_on_the_rewrite_engine_is_found_with_its_location():
    """The engine asks ctx.allow() and notifies each rewrite; bisect names the rule's line."""
    from fxpass.rewrite import P, rules

    x = P.var("x")
    wrong = rules("wrong_rsqrt", [(P(aten.rsqrt.default, x), lambda x: aten.sqrt.default(x))])
    gm, inputs = graph_and_inputs()
    first_rsqrt = next(n.name for n in gm.graph.nodes if n.target is aten.rsqrt.default)
    result = bisect(gm, fp.Pipeline(["cse", wrong]), inputs)
    rw = result.rewrite
    assert rw.pass_path == "wrong_rsqrt" and rw.pass_index == 1
    assert rw.old == [first_rsqrt] and rw.new and rw.new[0].startswith("sqrt")
    assert "test_bisect.py" in rw.location


def test_finds_a_bad_edit_a_library_pass_made_through_the_editor():
    """``inplace_to_functional`` rewrites through the editor, so the debug counter stops it
    after any rewrite: bisect names the one bad rewrite, with the pass's own line."""
    gm = planted_passes.scaled_in_place_graph()
    writes = [n for n in gm.graph.nodes if "scale_" in str(n.target)]
    bad = planted_passes.SCALES.index(planted_passes.BAD_SCALE) + 1
    result = bisect(gm, "inplace_to_functional", [torch.randn(4)])
    rw = result.rewrite
    assert (rw.index, rw.total, rw.pass_path) == (bad, len(writes), "inplace_to_functional")
    assert rw.rule == "inplace_to_functional" and rw.old == [writes[bad - 1].name]
    assert rw.location.startswith("inplace_to_functional.py:")
