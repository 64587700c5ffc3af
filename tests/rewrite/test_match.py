"""The four matchers agree, on random patterns over random graphs: interpreted
(:class:`~fxpass.rewrite.interpreted.Interpreter`), compiled (:func:`compile_rule`, and
whatever :func:`attempt` picks for a rule), explaining (:class:`Explainer`, :func:`explain`)
and torch-like (:class:`TorchMatching`, in its default configuration). At every node, for
every rule: the same match or none, the same bindings, nodes and chains seen through; over
the graph and a list of rules, the same first match; and ``explain`` says "matches" exactly
where they match. ``attempt`` is asked twice at every node: a rule with alternatives learns
the paths of its matches (:mod:`fxpass.rewrite.learned`) and tries them first the second
time. The interpreter is the reference semantics; nothing keeps the others equal to it but
this test."""

from __future__ import annotations

from typing import Any

import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from torch import fx
from torch.fx import Node

from fxpass.rewrite import P, Rule
from fxpass.rewrite._state import MatchState
from fxpass.rewrite.compile import compile_rule
from fxpass.rewrite.explain import Explainer, explain, explain_at
from fxpass.rewrite.interpreted import Interpreter
from fxpass.rewrite.match import Matcher, attempt
from fxpass.rewrite.region import lazy_order
from fxpass.rewrite.torchlike import TorchMatching

aten = torch.ops.aten
BINARY = [aten.add.Tensor, aten.mul.Tensor, aten.sub.Tensor]  # add, mul: commutative
UNARY = [aten.neg.default, aten.relu.default, aten.exp.default]
DTYPES = [torch.float32, torch.float16]
NAMES = ["a", "b", "c"]
LITERALS = [1, 2.0, 1.0, 2]  # 1 == 1.0: equal literals of another type
PLAIN = Interpreter()


# ----- random graphs ------------------------------------------------------------------------
@st.composite
def graphs(draw) -> fx.GraphModule:
    """Up to 3 inputs and 10 ops (binary ops on nodes or literals, ``alpha``, unary ops,
    views that keep the last dimension, casts that may change nothing), values in
    ``meta['val']``, and several outputs, so that inner nodes have users outside a match."""
    g = fx.Graph()
    nodes: list[Node] = []
    for i in range(draw(st.integers(1, 3))):
        node = g.placeholder(f"x{i}")
        shape = draw(st.sampled_from([(4,), (2, 4)]))
        node.meta["val"] = torch.zeros(shape, dtype=draw(st.sampled_from(DTYPES)))
        nodes.append(node)
    for _ in range(draw(st.integers(1, 10))):
        a = draw(st.sampled_from(nodes))
        kind = draw(
            st.sampled_from(
                ["binary", "binary", "literal", "literal", "alpha", "unary", "view", "cast"]
            )
        )
        kwargs: dict[str, Any] = {}
        if kind == "binary":
            op, args = draw(st.sampled_from(BINARY)), (a, draw(st.sampled_from(nodes)))
        elif kind == "literal":  # often on the op just made: a chain of literals to bind
            a = nodes[-1] if draw(st.booleans()) else a
            op, lit = draw(st.sampled_from(BINARY)), draw(st.sampled_from(LITERALS))
            lit = float(repr(lit)) if isinstance(lit, float) else lit  # equal, not the same object
            args = (a, lit) if draw(st.booleans()) else (lit, a)
            if not isinstance(args[0], Node):
                op = aten.add.Tensor  # a scalar first only where the op takes one: rsub aside
                args = (args[1], args[0])
        elif kind == "alpha":
            op, args, kwargs = aten.add.Tensor, (a, draw(st.sampled_from(nodes))), {"alpha": 2}
        elif kind == "unary":
            op, args = draw(st.sampled_from(UNARY)), (a,)
        elif kind == "view":  # mostly of the op just made: a pattern may see through it
            a = nodes[-1] if draw(st.booleans()) else a
            op, args = aten.view.default, (a, [1, *a.meta["val"].shape])
        else:
            a = nodes[-1] if draw(st.booleans()) else a
            op, args = aten._to_copy.default, (a,)
            kwargs = {"dtype": draw(st.sampled_from(DTYPES))}
        node = g.call_function(op, args, kwargs)
        values = [x.meta["val"] if isinstance(x, Node) else x for x in args]
        node.meta["val"] = op(*values, **kwargs)
        nodes.append(node)
    ops = [n for n in nodes if n.op == "call_function"]
    outs = [ops[-1], *draw(st.lists(st.sampled_from(ops), max_size=2))]
    g.output(tuple(dict.fromkeys(outs)))
    return fx.GraphModule(torch.nn.Module(), g)


# ----- random rules -------------------------------------------------------------------------
@st.composite
def rules(draw, index: int, gm: fx.GraphModule) -> Rule:
    """A rule over the graphs' ops: named and anonymous variables (a name used twice must
    bind one value), node-only and constrained ones, literals and wildcards for them, shared
    sub-patterns (a DAG), operand swaps on or off, ``...``, alternatives, ``P.through`` and
    ``P.cast``, lists; sometimes a ``where``, a second root, or ``contained=False``. Half the
    roots are written from a node of ``gm`` — its ops and literals, or nearly (another op, an
    alternative, swapped operands), down to variables that name the same graph node alike
    — so that matches and near misses are common, not rare."""
    made: list[Any] = []  # this rule's patterns, to share (patterns are not shared across rules)
    names: dict[Node, str] = {}  # graph node -> the name patterns written from gm give it

    def leaf() -> Any:
        kind = draw(
            st.sampled_from(
                ["var", "var", "any", "node", "dtype", "rank", "const", "literal", "share"]
            )
        )
        if kind == "share" and made:
            return draw(st.sampled_from(made))
        if kind == "any":
            return P.any()
        if kind == "node":
            return P.node(draw(st.sampled_from(NAMES)))
        if kind == "dtype":
            return P.var(draw(st.sampled_from(NAMES)), dtype=draw(st.sampled_from(DTYPES)))
        if kind == "rank":
            return P.var(draw(st.sampled_from(NAMES)), rank=draw(st.sampled_from([1, 2])))
        if kind == "const":
            return P.const("k", draw(st.sampled_from([None, float, int])))
        if kind == "literal":
            return draw(st.sampled_from(LITERALS))
        return P.var(draw(st.sampled_from(NAMES)))

    def kept(p: Any) -> Any:
        if isinstance(p, P) and draw(st.integers(0, 4)) == 0:
            p = p.named(draw(st.sampled_from(["r", "a"])))
        made.append(p)
        return p

    def pattern(depth: int) -> Any:
        """A pattern written without looking at the graph."""
        if depth > 0 and (depth >= 3 or draw(st.integers(0, 2)) == 0):
            return leaf()
        kind = draw(
            st.sampled_from(
                ["binary", "binary", "unary", "alpha", "rest", "view", "any_of", "through", "cast"]
            )
        )
        if kind == "binary":
            p = P(draw(st.sampled_from(BINARY)), pattern(depth + 1), pattern(depth + 1))
            if draw(st.integers(0, 3)) == 0:
                p = p.commute(False)
        elif kind == "unary":
            p = P(draw(st.sampled_from(UNARY)), pattern(depth + 1))
        elif kind == "alpha":
            p = P(aten.add.Tensor, pattern(depth + 1), pattern(depth + 1), alpha=leaf())
        elif kind == "rest":
            p = P(draw(st.sampled_from(BINARY)), pattern(depth + 1), ...)
        elif kind == "view":
            shape = draw(st.sampled_from([[1, 4], [1, 2, 4], [P.const("d"), 4], P.var("s")]))
            p = P(aten.view.default, pattern(depth + 1), shape)
        elif kind == "any_of":
            p = P.any_of(pattern(depth + 1), pattern(depth + 1))
        elif kind == "through":
            p = P.through(pattern(depth + 1), views=draw(st.booleans()), casts=True)
        else:
            dtype = draw(st.sampled_from([None, *DTYPES]))
            p = P.cast(pattern(depth + 1), dtype, optional=draw(st.booleans()))
        return kept(p)

    def written(v: Any, depth: int) -> Any:
        """A pattern written from ``v`` (a graph node or argument), true to it or nearly."""
        if isinstance(v, list):  # a view's shape
            return draw(st.sampled_from([v, v, [P.const("d"), *v[1:]], P.var("s")]))
        if isinstance(v, (int, float)):
            other = float(v) if isinstance(v, int) else int(v)  # equal, of another type
            return draw(st.sampled_from([v, other, P.const("k"), P.const("k"), P.scalar("k")]))
        if not isinstance(v, Node):  # a dtype
            return draw(st.sampled_from([v, v, P.const("k")]))
        if v.op != "call_function" or depth >= 3 or (depth and draw(st.integers(0, 3)) == 0):
            if draw(st.integers(0, 3)) == 0:
                return leaf()
            name = names.setdefault(v, draw(st.sampled_from([*NAMES, f"n{len(names)}"])))
            return P.node(name) if draw(st.booleans()) else P.var(name)
        seen_through = v.target in (aten.view.default, aten._to_copy.default)
        if seen_through and draw(st.booleans()):  # may match through it, or stop at a cast
            return kept(P.through(written(v.args[0], depth + 1), views=True, casts=True))
        change = draw(st.integers(0, 9))
        op = v.target
        if change == 1 and not v.kwargs and (op in UNARY or op in BINARY):  # another op
            op = draw(st.sampled_from(UNARY if op in UNARY else BINARY))
        args = [written(a, depth + 1) for a in v.args]
        kwargs = {k: written(a, depth + 1) for k, a in v.kwargs.items()}
        if change == 2 and len(args) == 2:
            args.reverse()  # matches where the op commutes
        p = P(op, *args, **kwargs)
        if change == 3 and p.commutative:
            p = p.commute(False)
        if change == 4:
            p = P.any_of(pattern(depth + 1), p) if draw(st.booleans()) else P.any_of(p, leaf())
        return kept(p)

    ops = [n for n in gm.graph.nodes if n.op == "call_function"]
    write = draw(st.booleans())
    deep = ops[-3:] if draw(st.booleans()) else ops  # the last ops have the most below them
    roots = [written(draw(st.sampled_from(deep)), 0) if write else pattern(0)]
    if draw(st.integers(0, 3)) == 0:  # a second root, linked by a name or a shared pattern
        if write:
            roots.append(written(draw(st.sampled_from(ops)), 0))
        else:
            link = draw(st.sampled_from(made)) if made and draw(st.booleans()) else P.var("a")
            roots.append(P(draw(st.sampled_from(BINARY)), link, pattern(2)))
    where = None
    if draw(st.integers(0, 4)) == 0:
        where = lambda **bound: len(bound) % 2 == 0  # noqa: E731 - a where that depends on them
    options = {"name": f"r{index}", "where": where, "contained": draw(st.booleans())}
    try:
        return Rule(tuple(roots) if len(roots) > 1 else roots[0], lambda **b: None, **options)
    except ValueError:  # a second root the first does not reach: one root
        return Rule(roots[0], lambda **b: None, **options)


# ----- what each matcher finds --------------------------------------------------------------
def _found(ok: bool, st: MatchState) -> tuple:
    if not ok:
        return (False,)
    m = st.found
    return (True, m.bindings, m.nodes, m.outputs, m.chains)


def _interpreted(rule: Rule, node: Node, order: Any) -> tuple:
    st = MatchState(order=order)
    st.roots = [node]
    return _found(PLAIN.match_rule(rule, node, st), st)


def _compiled(rule: Rule, node: Node, order: Any) -> tuple | None:
    c = compile_rule(rule)
    if c is None:
        return None
    st = MatchState(order=order)
    st.roots = [node]
    return _found(c.fn(node, st, PLAIN.final), st)


def _attempted(rule: Rule, node: Node, order: Any, interp: Interpreter = PLAIN) -> tuple:
    st = MatchState(order=order)
    return _found(attempt(rule, node, st, interp), st)


def _first(matcher: Matcher, gm: fx.GraphModule) -> tuple | None:
    """The first node (in graph order) where some rule matches, the rule, and its match."""
    order = lazy_order(gm.graph)
    for node in gm.graph.nodes:
        m = matcher.match(node, order=order)
        if m is not None:
            return (node, m.rule.name, m.bindings, m.nodes)
    return None


def _agree(gm: fx.GraphModule, rule_list: list[Rule]) -> list[str]:
    """Every matcher finds, at every node, what the interpreter finds; explain agrees; the
    first match over the graph is the same whichever matcher looks for it. Returns what
    was seen (for ``--hypothesis-show-statistics``)."""
    seen = []
    order = lazy_order(gm.graph)
    torchlike = TorchMatching()
    for rule in rule_list:
        matched = []
        for node in gm.graph.nodes:
            want = _interpreted(rule, node, order)
            compiled = _compiled(rule, node, order)
            assert compiled is None or compiled == want, ("compiled", rule, node)
            assert _attempted(rule, node, order) == want, ("attempt", rule, node)
            assert _attempted(rule, node, order, torchlike) == want, ("torch-like", rule, node)
            explained = explain_at(rule, node, order)
            assert explained.matched == want[0], ("explain", rule, node, str(explained))
            if want[0]:
                matched.append(node)
                seen.append("a match" + (" seen through a chain" if want[4] else ""))
        assert explain(rule, gm).matches == matched, ("explain over the graph", rule)
        for node in gm.graph.nodes:  # again: the paths learned anywhere now go first
            assert _attempted(rule, node, order) == _interpreted(rule, node, order), (
                "attempt, paths learned",
                rule,
                node,
            )
        seen.append("compiled" if compile_rule(rule) is not None else "interpreted only")
        seen.append(f"{len(rule.roots)} root(s), matched at {min(len(matched), 2)}+ nodes")
    firsts = {
        name: _first(Matcher(rule_list, interp), gm)
        for name, interp in (("plain", None), ("explain", Explainer()), ("torch-like", torchlike))
    }
    assert firsts["explain"] == firsts["plain"] and firsts["torch-like"] == firsts["plain"]
    for node in gm.graph.nodes:  # the index hands each node every rule that can match there
        by_index = Matcher(rule_list).match(node, order=order)
        direct = next((r.name for r in rule_list if _interpreted(r, node, order)[0]), None)
        assert (by_index.rule.name if by_index else None) == direct, ("index", node)
    return seen


@settings(
    max_examples=250,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(gm=graphs(), data=st.data())
def test_the_four_matchers_find_the_same_matches(gm, data):
    count = data.draw(st.integers(1, 3))
    for what in _agree(gm, [data.draw(rules(i, gm), label=f"rule {i}") for i in range(count)]):
        event(what)


def test_the_four_matchers_agree_on_a_name_bound_to_equal_literals_of_two_nodes():
    """A case the random graphs reach rarely: ``k`` bound at two nodes to literals that are
    equal but not the same object (2.0 and 2.0, 2.0 and 2), or not equal (2.0 and 1.0)."""
    g = fx.Graph()
    x = g.placeholder("x")
    x.meta["val"] = torch.zeros(4)
    last = x
    for lit in (float("2.0"), float("2.0"), 2, 1.0):
        last = g.call_function(aten.add.Tensor, (last, lit))
        last.meta["val"] = torch.zeros(4)
    g.output((last,))
    gm = fx.GraphModule(torch.nn.Module(), g)
    inner = P(aten.add.Tensor, P.var("x"), P.const("k"))
    twice = [
        Rule(P(aten.add.Tensor, inner, P.const("k")), lambda **b: None, name="const"),
        Rule(P(aten.add.Tensor, inner, P.scalar("k")), lambda **b: None, name="scalar"),
    ]
    assert [r.name for r in twice if any(r.match(n) for n in g.nodes)] == ["const", "scalar"]
    _agree(gm, twice)
