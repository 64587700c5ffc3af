"""remove_assert_ops on real exported graphs: asserts go, values stay, fusions then match."""

from __future__ import annotations

import torch

import fxpass as fp
from fxpass.rewrite import explain

from _models import ASSERT, count, decoder, exported, exported_gm

aten = torch.ops.aten


def test_removes_every_metadata_assert_and_keeps_outputs():
    ep = exported()
    gm = ep.graph_module
    before = count(gm, ASSERT)
    assert before > 0
    n_before = len(gm.graph.nodes)
    (ids,) = decoder().example_inputs()
    expected = ep.module()(ids)
    result = fp.Pipeline(["remove_assert_ops"]).run(gm)
    assert result.modified
    assert count(gm, ASSERT) == 0
    assert len(gm.graph.nodes) == n_before - before
    assert result.report.stats()["remove_assert_ops.removed"] == before
    torch.testing.assert_close(ep.module()(ids), expected, rtol=0, atol=0)


def test_nothing_to_remove_is_not_a_change():
    gm = exported_gm(remove_asserts=True)
    result = fp.Pipeline(["remove_assert_ops"]).run(gm)
    assert not result.modified


def test_debug_counter_limits_removals():
    gm = exported_gm()
    before = count(gm, ASSERT)
    fp.Pipeline(["remove_assert_ops"]).run(gm, debug_counter=fp.core.DebugCounter(count=2))
    assert count(gm, ASSERT) == before - 2


def test_asserts_hide_the_norm_until_removed():
    # The fused pattern's inner nodes carry asserts; explain names them as extra users.
    from fxpass.rewrite import P, Rule

    x = P.var("x")
    h = P.cast(x, torch.float32)
    var = P(aten.mean.dim, P(aten.pow.Tensor_Scalar, h, 2), [-1], True)
    norm = P(aten.mul.Tensor, h, P(aten.rsqrt.default, P(aten.add.Tensor, var, P.const("eps"))))
    rule = Rule(P.cast(norm, torch.bfloat16), lambda x: x, drop_users=())
    gm = exported_gm()
    why = explain(rule, gm)
    assert not why.matches
    assert "extra user" in str(why) and "_assert_tensor_metadata" in str(why)
    fp.as_pass("remove_assert_ops")(gm)  # a pass is handed its context: run it as one
    assert explain(rule, gm).matches


def test_shape_checks_are_removed_with_the_conditions_they_check():
    class M(torch.nn.Module):
        def forward(self, x, k):
            n = k.item()
            torch._check(n >= 2)
            return x.new_zeros(n) + x.sum()

    args = (torch.randn(4, 3), torch.tensor(3))
    gm = torch.export.export(M(), args).run_decompositions().module()
    scalar_assert = aten._assert_scalar.default
    checks = [n for n in gm.graph.nodes if n.target is scalar_assert]
    assert checks
    fp.Pipeline([fp.registry.create("remove_assert_ops", shape_checks=False)]).run(gm)
    assert [n for n in gm.graph.nodes if n.target is scalar_assert] == checks
    expected = gm(*args)
    result = fp.Pipeline(["remove_assert_ops"]).run(gm)
    assert not [n for n in gm.graph.nodes if n.target is scalar_assert]
    assert result.report.stats()["remove_assert_ops.removed_scalar"] >= 1  # the comparison
    torch.testing.assert_close(gm(*args), expected)


def test_exported_program_keeps_working(llama_ep):
    before = count(llama_ep.graph_module, ASSERT)
    assert before
    ep = exported()
    (ids,) = decoder().example_inputs()
    expected = ep.module()(ids)
    fp.as_pass("remove_assert_ops")(ep.graph_module)  # a pass is handed its context
    ep.graph_module.recompile()
    assert count(ep.graph_module, ASSERT) == 0
    torch.testing.assert_close(ep.module()(ids), expected, rtol=0, atol=0)
