"""Learned paths (:mod:`fxpass.rewrite.learned`): a rule with alternatives learns the way its
matches go and tries it first, finding, node for node, what the interpreter finds. The
random-rule agreement (tests/rewrite/test_match.py) runs every node twice so that the paths
learned anywhere in a graph are tried everywhere; these are the cases it reaches rarely."""

from __future__ import annotations

from typing import Any

import torch
from torch import fx
from torch.fx import Node

from fxpass.rewrite import P, Rule
from fxpass.rewrite._state import MatchState
from fxpass.rewrite.compile import compile_path
from fxpass.rewrite.interpreted import Interpreter
from fxpass.rewrite.learned import _Trail
from fxpass.rewrite.match import attempt, compiled
from fxpass.rewrite.region import lazy_order

aten = torch.ops.aten
PLAIN = Interpreter()


def _graph(build) -> fx.GraphModule:
    """A graph of float32 (2, 4) values; ``build(g, x, y)`` returns the outputs."""
    g = fx.Graph()
    x, y = g.placeholder("x"), g.placeholder("y")
    for p in (x, y):
        p.meta["val"] = torch.zeros(2, 4)

    def call(op, *args, **kwargs):
        node = g.call_function(op, args, kwargs)
        vals = [a.meta["val"] if isinstance(a, Node) else a for a in args]
        node.meta["val"] = op(*vals, **kwargs)
        return node

    g.output(tuple(build(call, x, y)))
    return fx.GraphModule(torch.nn.Module(), g)


def _found(ok: bool, st: MatchState) -> tuple:
    m = st.found
    return (True, m.bindings, m.nodes, m.chains) if ok else (False,)


def _agree(rule: Rule, gm: fx.GraphModule, turns: int = 2) -> None:
    order = lazy_order(gm.graph)
    for _ in range(turns):
        for node in gm.graph.nodes:
            ref = MatchState(order=order)
            ref.roots = [node]
            want = _found(PLAIN.match_rule(rule, node, ref), ref)
            st = MatchState(order=order)
            assert _found(attempt(rule, node, st), st) == want, node.name


def _paths(rule: Rule) -> list[Any]:
    return compiled(rule).fn.fns


def test_a_rule_with_alternatives_learns_the_path_of_its_matches_and_keeps_them():
    inner = P.any_of(P(aten.exp.default, P.var("a")), P(aten.relu.default, P.var("a")))
    rule = Rule(P(aten.neg.default, inner), lambda **b: None)
    gm = _graph(lambda call, x, y: [call(aten.neg.default, call(aten.relu.default, x))])
    _agree(rule, gm)
    assert len(_paths(rule)) == 1  # the second option is forced: the first's exp is no relu
    # the path expects relu: an exp site is found by the search, and teaches its own path
    _agree(rule, _graph(lambda call, x, y: [call(aten.neg.default, call(aten.exp.default, y))]))
    assert len(_paths(rule)) == 2


def test_an_option_taken_after_an_earlier_one_failed_deeper_is_not_learned():
    # mul(a, mul(a, b)) | mul(a, b): at mul(x, y) the first option starts (a mul) and fails
    # below; a path taking the second there would miss the first at mul(x, mul(x, y))
    a, b = P.var("a"), P.var("b")
    rule = Rule(
        P.any_of(P(aten.mul.Tensor, a, P(aten.mul.Tensor, a, b)), P(aten.mul.Tensor, a, b)),
        lambda **k: None,
    )

    def build(call, x, y):
        inner = call(aten.mul.Tensor, x, y)
        return [inner, call(aten.mul.Tensor, x, inner)]

    _agree(rule, _graph(build))
    trail = _Trail()
    gm = _graph(build)
    node = next(n for n in gm.graph.nodes if n.op == "call_function")  # mul(x, y)
    st = MatchState(order=lazy_order(gm.graph))
    st.roots = [node]
    assert trail.match_rule(rule, node, st) and not trail.forced


def test_a_structure_the_whole_match_checks_turn_down_lets_the_search_go_on():
    # relu(a) first; where says no when a is a neg: the search then finds relu(neg(b))
    rule = Rule(
        P.any_of(
            P(aten.relu.default, P.var("a")),
            P(aten.relu.default, P(aten.neg.default, P.var("b"))),
        ),
        lambda **k: None,
        where=lambda a=None, b=None: b is not None or a.target is not aten.neg.default,
    )
    gm = _graph(
        lambda call, x, y: [
            call(aten.relu.default, x),  # teaches the path of option 1
            call(aten.relu.default, call(aten.neg.default, y)),
        ]
    )
    _agree(rule, gm)
    assert len(_paths(rule)) == 1
    relu_neg = [n for n in gm.graph.nodes if n.target is aten.relu.default][-1]
    st = MatchState(order=lazy_order(gm.graph))
    assert attempt(rule, relu_neg, st) and "b" in st.found.bindings


def test_a_path_through_views_expects_the_same_views():
    rule = Rule(
        P.any_of(
            P(aten.exp.default, P.through(P(aten.neg.default, P.var("a")))),
            P(aten.exp.default, P.var("a")),
        ),
        lambda **k: None,
    )

    def build(call, x, y):
        seen = call(aten.exp.default, call(aten.view.default, call(aten.neg.default, x), [1, 2, 4]))
        return [seen, call(aten.exp.default, call(aten.neg.default, y))]

    gm = _graph(build)
    _agree(rule, gm)
    first = next(n for n in gm.graph.nodes if n.target is aten.exp.default)
    st = MatchState(order=lazy_order(gm.graph))
    assert attempt(rule, first, st) and len(st.found.chains) == 1
    assert len(_paths(rule)) == 2  # one with the view, one without


def test_a_compiled_path_reads_as_the_pattern_it_follows():
    rule = Rule(
        P.any_of(P(aten.exp.default, P.var("a")), P(aten.relu.default, P.scalar("k"))),
        lambda **k: None,
    )
    gm = _graph(lambda call, x, y: [call(aten.exp.default, x)])
    node = next(n for n in gm.graph.nodes if n.target is aten.exp.default)
    trail = _Trail()
    st = MatchState(order=lazy_order(gm.graph))
    st.roots = [node]
    assert trail.match_rule(rule, node, st) and trail.forced
    source = compile_path(rule, trail.path).source
    assert "return True if final(" in source and "relu" not in source
