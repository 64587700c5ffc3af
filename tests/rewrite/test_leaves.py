"""The patterns that are not op calls (rewrite/leaves.py), on real graphs: literals and
literal wildcards, variables bound once, DAGs (one object used twice), values seen through
views and no-op casts, and scalars."""

from __future__ import annotations

import pytest
import torch
from _rewrite_helpers import edge, traced

from fxpass.rewrite import P, RewriteError, Rule, explain, rewrite

from _models import exported_gm

aten = torch.ops.aten


def _matches(rule, gm):
    return explain(rule, gm).matches


def test_literal_wildcard_captures_any_eps():
    eps = P.const("eps", float)
    rule = Rule(P(aten.add.Tensor, P(aten.mean.dim, P.any(), [-1], True), eps), lambda: None)
    for value in (1e-6, 1e-5):
        gm = exported_gm(eps=value)
        hits = _matches(rule, gm)
        assert len(hits) == 5
        assert {rule.match(n).bindings["eps"] for n in hits} == {value}


def test_literal_must_equal_unless_wildcard():
    square = Rule(P(aten.pow.Tensor_Scalar, P.var("h"), 2), lambda h: None)
    cube = Rule(P(aten.pow.Tensor_Scalar, P.var("h"), 3), lambda h: None)
    gm = exported_gm()
    assert len(_matches(square, gm)) == 5 and not _matches(cube, gm)
    assert "literal differs" in str(explain(cube, gm))


def test_dag_pattern_same_value_twice():
    h = P.cast(P.node("x"), torch.float32)
    var = P(aten.mean.dim, P(aten.pow.Tensor_Scalar, h, 2), [-1], True)
    norm = P(aten.mul.Tensor, h, P(aten.rsqrt.default, P(aten.add.Tensor, var, P.const("eps"))))
    rule = Rule(norm, lambda x, eps: None)
    gm = exported_gm(remove_asserts=True)
    hits = _matches(rule, gm)
    assert len(hits) == 5
    m = rule.match(hits[0])
    upcasts = [n for n in m.nodes if n.target is aten._to_copy.default]
    assert len(upcasts) == 1  # the one cast feeds both the square and the product


def test_same_name_must_bind_same_value():
    x = P.var("x")
    double = Rule(P(aten.add.Tensor, x, x), lambda x: None)
    gm = traced(lambda a, b: torch.ops.aten.add.Tensor(a, a) + torch.ops.aten.add.Tensor(a, b))
    hits = _matches(double, gm)
    assert [n.args for n in hits] == [(gm.graph.find_nodes(op="placeholder")[0],) * 2]
    why = explain(double, [n for n in gm.graph.nodes if n.op == "call_function"][1])
    assert "already bound" in str(why)


class _RowWise(torch.nn.Module):
    """A softmax over the last dimension of a sum seen through a flattening reshape and a
    no-op ``.float()``; ``mix`` reshapes across the last dimension instead."""

    def __init__(self, mix: bool = False):
        super().__init__()
        self.mix = mix

    def forward(self, x, r):
        s = x + r
        flat = s.reshape(4, 16) if self.mix else s.reshape(-1, s.shape[-1])
        return torch.softmax(flat.float(), -1), s


_ROW_ARGS = (torch.randn(2, 4, 8), torch.randn(2, 4, 8))


def _softmax_of_sum():
    total = P(aten.add.Tensor, P.var("a"), P.var("b")).named("sum")
    pattern = P(aten.softmax.int, P.through(total).named("top"), -1)

    def softmax_of_sum(a, b):
        new = aten.add.Tensor(a, b)
        return aten.softmax.int(new, -1), new

    return Rule(pattern, softmax_of_sum, outputs=["sum"])


def test_through_sees_views_and_noop_casts_and_the_rewrite_replays_them():
    ep = torch.export.export(_RowWise(), _ROW_ARGS)
    expected = ep.module()(*_ROW_ARGS)
    rule = _softmax_of_sum()
    (root,) = explain(rule, ep.graph_module).matches
    match = rule.match(root)
    assert match["top"] is root.args[0] and match["sum"].target is aten.add.Tensor
    assert [n.target for n in match.chains[0]] == [aten.reshape.default, aten.to.dtype]
    assert rewrite(ep.graph_module, [rule], once=True).rewrites == 1
    ep.graph_module.recompile()
    out = ep.module()(*_ROW_ARGS)
    torch.testing.assert_close(out, expected)
    softmax = next(n for n in ep.graph.nodes if n.target is aten.softmax.int)
    (replayed,) = softmax.users  # the chain, on the new value: it has the old shape again
    assert replayed.target is aten.reshape.default and tuple(replayed.meta["val"].shape) == (8, 8)
    assert [n.target for n in replayed.users] == [aten.to.dtype]  # a no-op cast: replayed too


def test_through_refuses_views_that_mix_rows():
    ep = torch.export.export(_RowWise(mix=True), _ROW_ARGS)
    why = explain(_softmax_of_sum(), ep.graph_module)
    assert not why.matches and "expected aten.add.Tensor" in str(why)


def test_through_only_where_asked():
    ep = torch.export.export(_RowWise(), _ROW_ARGS)
    total = P(aten.add.Tensor, P.var("a"), P.var("b"))
    casts_only = Rule(P(aten.softmax.int, P.through(total, views=False), -1), lambda **b: None)
    assert not explain(casts_only, ep.graph_module).matches


class _SharedView(torch.nn.Module):
    def forward(self, x):
        v = torch.neg(x).view(8, 8)
        return torch.relu(v), v * 2


def test_a_chain_from_an_inner_node_is_part_of_the_match():
    ep = torch.export.export(_SharedView(), (torch.randn(2, 4, 8),))
    rule = Rule(P(aten.relu.default, P.through(P(aten.neg.default, P.var("x")))), lambda x: x)
    why = explain(rule, ep.graph_module)
    assert not why.matches and "extra user: %view is also used by %mul" in str(why)


def test_a_replacement_no_chain_explains_is_an_error_and_changes_nothing():
    ep = torch.export.export(_RowWise(), _ROW_ARGS)
    total = P(aten.add.Tensor, P.var("a"), P.var("b")).named("sum")
    rule = Rule(
        P(aten.softmax.int, P.through(total), -1),
        lambda a, b, sum: (aten.sum.dim_IntList(a, [0]), sum),  # (4, 8): neither chain end
        outputs=["sum"],
    )
    before = str(ep.graph)
    with pytest.raises(RewriteError, match=r"shape \[4, 8\], the replaced node \[8, 8\]"):
        rewrite(ep.graph_module, [rule], once=True)
    assert str(ep.graph) == before


# ----- P.scalar and the Edge dialect --------------------------------------------------------
def test_scalar_takes_literals_and_lifted_constants():
    eps_add = Rule(
        P(aten.add.Tensor, P(aten.mean.dim, P.any(), [-1], True), P.scalar("eps")), lambda: None
    )
    aten_hits = explain(eps_add, exported_gm()).matches
    edge_gm = edge().edge_program("llama").graph_module
    edge_hits = explain(eps_add, edge_gm).matches
    assert len(aten_hits) == len(edge_hits) == 5
    lifted = edge_hits[0].args[1]
    assert lifted.op == "placeholder" and eps_add.match(edge_hits[0])["eps"] == pytest.approx(1e-6)
    inputs = Rule(P(aten.mul.Tensor, P.scalar("s"), P.any()), lambda: None)
    assert not any(n.op == "placeholder" for h in explain(inputs, edge_gm).matches for n in h.args)
