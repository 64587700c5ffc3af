"""The op pattern ``P`` on real graphs: op sets, predicates on meta['val'], commutative
operands, optional casts, schema defaults and ``...``, dialects, and where it was written
(the other patterns are in test_leaves.py)."""

from __future__ import annotations

import operator

import pytest
import torch
from _rewrite_helpers import edge, traced

from fxpass.rewrite import P, Rule, explain, rewrite
from fxpass.rewrite.pattern import CAST_OPS

from _models import exported, exported_gm

aten = torch.ops.aten


def _matches(rule, gm):
    return explain(rule, gm).matches


def test_predicates_on_meta_val():
    x = P.node("x", dtype=torch.float32, rank=3)
    rule = Rule(P(aten.pow.Tensor_Scalar, x, 2), lambda x: None)
    assert len(_matches(rule, exported_gm())) == 5
    bf16 = Rule(P(aten.pow.Tensor_Scalar, P.node("x", dtype=torch.bfloat16), 2), lambda x: None)
    why = explain(bf16, exported_gm())
    assert not why.matches and "dtype of" in str(why)
    shaped = Rule(P(aten.pow.Tensor_Scalar, P.node("x", shape=(1, 8, None)), 2), lambda x: None)
    assert len(_matches(shaped, exported_gm())) == 5
    per_head = Rule(
        P(aten.pow.Tensor_Scalar, P.node("x", rank=4), 2).check(where=lambda n: True),
        lambda x: None,
    )
    assert len(_matches(per_head, exported_gm(qk_norm=True))) == 4  # the q/k norms


def test_commutative_operands_weight_first_or_last():
    w, h = P.node("w", rank=1), P.node("h", rank=3)
    rule = Rule(
        P(aten.mul.Tensor, w, h), lambda w, h: None
    )  # the graph writes mul(w, h) or mul(h, w)
    assert len(_matches(rule, exported_gm())) == 5  # llama: weight first
    assert len(_matches(rule, exported_gm(norm_style="plain"))) == 5  # plain: weight last
    fixed = Rule(P(aten.mul.Tensor, h, w).commute(False), lambda w, h: None)
    assert not _matches(fixed, exported_gm())


def test_optional_cast_and_cast_dtype():
    x = P.node("x")
    up = P.cast(x, torch.float32, optional=True)
    rule = Rule(P(aten.pow.Tensor_Scalar, up, 2), lambda x: None)
    assert len(_matches(rule, exported_gm())) == 5  # with the upcast
    assert len(_matches(rule, exported_gm(norm_style="plain"))) == 5  # without
    down = Rule(P(aten.pow.Tensor_Scalar, P.cast(x, torch.float16), 2), lambda x: None)
    assert not _matches(down, exported_gm())
    assert aten._to_copy.default in CAST_OPS and "float" in CAST_OPS


def test_op_sets_cover_aten_torch_and_methods():
    rsqrt = Rule(P({aten.rsqrt.default, torch.rsqrt, "rsqrt"}, P.var("x")), lambda x: None)
    gm = traced(lambda a: torch.rsqrt(a) + a.rsqrt() + torch.ops.aten.rsqrt.default(a))
    assert len(_matches(rsqrt, gm)) == 3
    packet = Rule(P(aten.rsqrt, P.var("x")), lambda x: None)  # any overload of the packet
    assert len(_matches(packet, gm)) == 1


def test_exact_ops_compare_targets_and_operand_order_as_torch_does():
    graph = torch.fx.Graph()
    a, b = graph.placeholder("a"), graph.placeholder("b")
    calls = [
        graph.call_function(aten.mul, (a, b)),  # the packet itself
        graph.call_function(aten.mul.Tensor, (a, b)),  # one of its overloads
        graph.call_function(aten.mul, (b, a)),  # operands swapped
    ]
    graph.output(tuple(calls))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    x, y = P.var("x"), P.var("y")
    for pattern, hits in [
        (P(aten.mul, x, y), calls[1:2]),  # the packet's overloads
        (P.exact(aten.mul, x, y), calls[:1] + calls[2:]),  # the packet itself
    ]:
        assert explain(Rule(pattern, lambda x, y: None), gm).matches == hits
    same = Rule(P.exact(aten.mul, x, x), lambda x: None)
    assert not explain(same, gm).matches
    first_a = P.exact(aten.mul, P.var("x", where=lambda v: v is a), y)
    assert explain(Rule(first_a, lambda x, y: None), gm).matches == calls[:1]


def test_schema_defaults_and_free_rest():
    gm = exported_gm(remove_asserts=True)
    strict = Rule(P(aten._to_copy.default, P.var("x")), lambda x: None)  # dtype left out
    assert not _matches(strict, gm)  # the graph's casts give dtype: not the default
    assert "must be its default" in str(explain(strict, gm))
    casts = [n for n in gm.graph.nodes if n.target is aten._to_copy.default]
    free = Rule(P(aten._to_copy.default, P.var("x"), ...), lambda x: None)
    assert _matches(free, gm) == casts
    keyword = Rule(P(aten._to_copy.default, P.var("x"), dtype=torch.float32), lambda x: None)
    upcasts = [n for n in casts if n.kwargs == {"dtype": torch.float32}]
    assert _matches(keyword, gm) == upcasts and len(upcasts) < len(casts)


def test_bad_patterns_say_what_is_wrong():
    with pytest.raises(TypeError, match="required argument 'dim'"):
        P(aten.mean.dim, P.var("x"))
    with pytest.raises(TypeError, match="has no argument 'axis'"):
        P(aten.mean.dim, P.var("x"), [-1], axis=1)
    with pytest.raises(ValueError, match="last positional"):
        P(aten.add.Tensor, ..., P.var("x"))
    with pytest.raises(TypeError, match="op must be"):
        P(42, P.var("x"))


def test_every_pattern_knows_where_it_was_written():
    p = P(aten.relu.default, P.var("x"))
    assert p.location.endswith(
        f"test_pattern.py:{test_every_pattern_knows_where_it_was_written.__code__.co_firstlineno + 1}"
    )
    rule = Rule(p, lambda x: x)
    assert "test_pattern.py" in rule.location and "test_pattern.py" in repr(rule)


def test_patterns_match_dynamo_graphs():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
    graphs = []
    torch._dynamo.reset()
    torch.compile(model, backend=lambda gm, ex: (graphs.append(gm), gm.forward)[1])(
        torch.randn(2, 8)
    )
    torch._dynamo.reset()
    relu = Rule(
        P({torch.relu, torch.nn.functional.relu, "relu"}, P.node("x", rank=2), ...),
        lambda x: None,
    )
    assert len(_matches(relu, graphs[0])) == 1


def test_rewrite_with_an_op_set_on_an_exported_program():
    ep = exported()
    (ids,) = __import__("_models").decoder().example_inputs()
    expected = ep.module()(ids)
    half = Rule(
        P({aten.mul.Tensor, aten.mul.Scalar}, P.node("x"), 0.5),
        lambda x: torch.ops.aten.div.Tensor(x, 2.0),
    )
    assert rewrite(ep.graph_module, [half]).rewrites >= 1
    torch.testing.assert_close(ep.module()(ids), expected)
    assert operator.getitem


# ----- P.through: views and no-op casts between the ops a pattern names ---------------------
def test_aten_patterns_match_edge_ops_and_the_other_way_round():
    edge_gm = edge().edge_program("llama").graph_module  # skips where ExecuTorch is missing
    from executorch.exir.dialects._ops import ops as exir_ops

    square = Rule(P(aten.pow.Tensor_Scalar, P.var("h"), 2), lambda h: None)
    edge_square = Rule(P(exir_ops.edge.aten.pow.Tensor_Scalar, P.var("h"), 2), lambda h: None)
    for rule in (square, edge_square):
        assert len(_matches(rule, edge_gm)) == len(_matches(rule, exported_gm())) == 5
    only_edge = Rule(P.exact(exir_ops.edge.aten.pow.Tensor_Scalar, P.var("h"), 2), lambda h: None)
    assert len(_matches(only_edge, edge_gm)) == 5 and not _matches(only_edge, exported_gm())


class _Casts(torch.nn.Module):
    def forward(self, x):
        return x.double().float().relu()


def test_cast_knows_edge_dim_order_casts():
    to_edge = pytest.importorskip("executorch.exir").to_edge  # the executorch extra

    gm = to_edge(torch.export.export(_Casts(), (torch.randn(4),))).exported_program().graph_module
    round_trip = Rule(P.cast(P.cast(P.var("x"), torch.float64), torch.float32), lambda x: x)
    (hit,) = _matches(round_trip, gm)
    assert "_to_dim_order_copy" in str(hit.target)
