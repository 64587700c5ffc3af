"""Rules as data: tuples and Rule objects, rule sets composed with +, replacements that
decline or return several outputs, and clear errors for rules that cannot work."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from _rewrite_helpers import count, exported_arith, run

import fxpass as fp
from fxpass.rewrite import GraphReplacement, P, RewriteError, Rule, RuleSet, rewrite, rules

aten = torch.ops.aten
x = P.var("x")

IDENTITIES = rules(
    "identities",
    [
        (P(aten.mul.Tensor, x, 1), lambda x: x),
        (P(aten.add.Tensor, x, 0), lambda x: x),
    ],
)
NEG = rules("neg", [(P(aten.neg.default, P(aten.neg.default, x)), lambda x: x)])


def test_a_rule_set_is_a_pass_and_composes_with_plus():
    ep, args = exported_arith()
    expected = run(ep, args)
    both = IDENTITIES + NEG
    assert isinstance(both, RuleSet) and len(both) == 3 and both.name == "identities+neg"
    result = fp.Pipeline([both]).run(ep.graph_module)
    gm = ep.graph_module
    assert count(gm, aten.mul.Tensor) == 1  # only c * 2 is left
    assert count(gm, aten.neg.default) == 0
    torch.testing.assert_close(run(ep, args), expected)
    stats = result.report.stats()
    assert stats["identities+neg.rewrites"] == 3
    first = IDENTITIES.rules[0].name
    assert stats[f"identities+neg.{first}.rewritten"] == 1


def test_rule_names_and_locations():
    r, r2 = IDENTITIES.rules
    source = Path(__file__).read_text().splitlines()
    line = int(r.location.rsplit(":", 1)[1])
    assert "aten.mul.Tensor, x, 1" in source[line - 1]  # the line the rule is written on
    assert r.name == f"test_rule.py:{line}" and r2.name == f"test_rule.py:{line + 1}"
    named = Rule(P(aten.relu.default, x), lambda x: x, name="drop_relu")
    assert named.name == "drop_relu" and IDENTITIES[r2.name] is r2

    def fold(x):
        return x

    assert Rule(P(aten.relu.default, x), fold).name == "fold"
    with pytest.raises(KeyError, match="no rule named"):
        IDENTITIES["nope"]


def test_replacement_may_decline():
    ep, _ = exported_arith()
    only_ints = Rule(P(aten.mul.Tensor, x, P.const("k")), lambda x, k: x if k == 1 else None)
    result = rewrite(ep.graph_module, [only_ints])
    assert result.rewrites == 1 and result.stats[only_ints.name].declined == 1
    assert count(ep.graph_module, aten.mul.Tensor) == 1


def test_where_filters_before_building():
    ep, _ = exported_arith()
    built = []

    def build(x, k):
        built.append(k)
        return x

    rule = Rule(P(aten.mul.Tensor, x, P.const("k")), build, where=lambda k: k == 1)
    assert rewrite(ep.graph_module, [rule]).rewrites == 1 and built == [1]


def test_multi_output_rule_returns_tuple_or_dict():
    def graph():
        return torch.fx.symbolic_trace(lambda a, b: _sum_then_double(a, b))

    s = P(torch.add, P.var("a"), P.var("b")).named("s")
    pattern = P(torch.mul, s, 2)

    for replacement in (
        lambda a, b: (torch.add(a, b) * 2.0, torch.add(b, a)),
        lambda a, b: {"s": torch.add(b, a), "out": torch.add(a, b) * 2.0},
    ):
        gm = graph()
        expected = gm(torch.ones(2), torch.ones(2))
        rule = Rule(pattern.named("out"), replacement, outputs=["s"])
        assert rewrite(gm, [rule]).rewrites == 1
        gm.recompile()
        torch.testing.assert_close(gm(torch.ones(2), torch.ones(2)), expected)


def _sum_then_double(a, b):
    s = torch.add(a, b)
    return torch.mul(s, 2), s - 1


def test_bad_rules_say_what_is_wrong():
    with pytest.raises(TypeError, match="'y' is not a name the pattern binds"):
        Rule(P(aten.relu.default, x), lambda x, y: x)
    with pytest.raises(ValueError, match="output 'z' is not a name"):
        Rule(P(aten.relu.default, x), lambda x: x, outputs=["z"])
    with pytest.raises(TypeError, match="must be a Pattern"):
        Rule("relu", lambda: None)
    with pytest.raises(TypeError, match="Rule or a \\(pattern, replacement\\) tuple"):
        rules("bad", [42])
    with pytest.raises(ValueError, match="must share a node or a name"):
        Rule((P(aten.relu.default, x), P(aten.neg.default, P.var("y"))), lambda x, y: (x, y))


def test_registering_a_rule_set_as_a_pass():
    name = "test_rule_identities"
    fp.register(name)(lambda gm: rewrite(gm, IDENTITIES).modified)
    try:
        ep, args = exported_arith()
        expected = run(ep, args)
        assert fp.Pipeline.parse(name).run(ep.graph_module).modified
        torch.testing.assert_close(run(ep, args), expected)
    finally:
        fp.registry.unregister(name)


class _Double(GraphReplacement):
    """``x * 2`` written as ``x + x``, node by node, through the editor it is handed."""

    def __init__(self):
        self.editors = []

    def write(self, match, bindings, editor):
        self.editors.append(editor)
        x = bindings["x"].node
        return editor.create(match.graph, "call_function", aten.add.Tensor, (x, x), {})


def test_a_graph_replacement_writes_its_nodes_through_the_rewrites_editor():
    ep, args = exported_arith()
    expected = run(ep, args)
    events = []

    class Spy(fp.core.Instrumentation):
        def on_change(self, event, ctx):
            events.append((event.kind, event.rule, [n.target for n in event.new]))

    double = _Double()
    twice = rules("twice", [Rule(P(aten.mul.Tensor, x, 2), double, name="twice")])
    fp.Pipeline([twice]).run(ep.graph_module, instrument=[Spy()])
    assert count(ep.graph_module, aten.mul.Tensor) == 1  # x * 1 is not x * 2
    torch.testing.assert_close(run(ep, args), expected)
    assert events == [("replace", "twice", [aten.add.Tensor])]  # told once, by the rewrite
    assert len(double.editors) == 1 and double.editors[0].ctx is not None
    made = [n for n in ep.graph_module.graph.nodes if "fxpass_provenance" in n.meta]
    assert [n.target for n in made] == [aten.add.Tensor]


def test_a_replacement_is_a_function_or_a_graph_replacement_not_a_look_alike():
    class LooksLikeOne:
        def write(self, match, bindings, editor): ...

    with pytest.raises(TypeError, match="must be a function or a GraphReplacement"):
        Rule(P(aten.mul.Tensor, x, 2), LooksLikeOne())


def test_the_rewriter_applies_a_replacement_passed_per_match_under_the_name_given():
    from fxpass.rewrite import Rewriter

    ep, args = exported_arith()
    expected = run(ep, args)
    gm = ep.graph_module
    rule = Rule(P(aten.mul.Tensor, x, 2), lambda x: None, name="declines")  # its own: no
    node = next(n for n in gm.graph.nodes if n.target is aten.mul.Tensor and n.args[1] == 2)
    match = rule.match(node)
    double = _Double()
    rewriter = Rewriter(gm)
    assert rewriter.apply(match, replacement=double, name="entry")
    assert rule.replacement is not double and rule.name == "declines"  # the rule is as it was
    assert count(gm, aten.mul.Tensor) == 1 and len(double.editors) == 1
    assert double.editors[0] is rewriter.editor
    made = [n for n in gm.graph.nodes if "fxpass_provenance" in n.meta]
    assert [n.meta["fxpass_provenance"]["rule"] for n in made] == ["entry"]
    torch.testing.assert_close(run(ep, args), expected)

    class Raises(GraphReplacement):
        def write(self, match, bindings, editor):
            raise ValueError("no")

    node = next(n for n in gm.graph.nodes if n.target is aten.relu.default)
    relu = Rule(P(aten.relu.default, x), lambda x: x, name="relu")
    with pytest.raises(RewriteError, match="rule 'entry2'.*raised ValueError: no"):
        rewriter.apply(relu.match(node), replacement=Raises(), name="entry2")
