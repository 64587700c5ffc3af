"""Drivers: fixpoint and single walk, non-termination, overlaps, the op index, the debug
counter and instrumentation, statistics in the report, and fuzzed graphs keep their values."""

from __future__ import annotations

import pytest
import torch
from _rewrite_helpers import count, exported_arith, run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fxpass as fp
from fxpass.core.errors import NonConvergenceError
from fxpass.rewrite import P, Rule, rewrite, rules

aten = torch.ops.aten
x, y = P.var("x"), P.var("y")


def _chain(n):
    """relu applied n times to x, through symbolic_trace."""

    def f(a):
        for _ in range(n):
            a = torch.relu(a)
        return a

    return torch.fx.symbolic_trace(f)


DOUBLE_RELU = Rule(P(torch.relu, P(torch.relu, x)), lambda x: torch.relu(x), name="relu_relu")


def test_fixpoint_reaches_what_once_does_not():
    # add(x, 0) -> mul(x, 1) -> x: the second step applies to a node the first created
    steps = rules(
        "steps",
        [(P(torch.add, x, 0), lambda x: torch.mul(x, 1)), (P(torch.mul, x, 1), lambda x: x)],
    )
    once = torch.fx.symbolic_trace(lambda a: torch.relu(torch.add(a, 0)))
    fix = torch.fx.symbolic_trace(lambda a: torch.relu(torch.add(a, 0)))
    assert rewrite(once, steps, once=True).rewrites == 1
    assert count(once, torch.mul) == 1
    assert rewrite(fix, steps).rewrites == 2
    assert count(fix, torch.mul) == 0 and count(fix, torch.add) == 0


def test_a_forward_walk_sees_what_it_rewrote_before():
    gm = _chain(8)
    assert rewrite(gm, [DOUBLE_RELU], once=True).rewrites == 7
    assert count(gm, torch.relu) == 1
    gm.recompile()
    v = torch.randn(5)
    torch.testing.assert_close(gm(v), torch.relu(v))


def test_non_termination_is_a_clear_error_and_nothing_is_half_done():
    flip = rules(
        "flip",
        [
            (P(torch.add, x, y), lambda x, y: torch.sub(x, torch.neg(y))),
            (P(torch.sub, x, P(torch.neg, y)), lambda x, y: torch.add(x, y)),
        ],
    )
    gm = torch.fx.symbolic_trace(lambda a, b: torch.add(a, b))
    before = gm.code
    try:
        fp.Pipeline([flip]).run(gm)
    except fp.PassFailedError as e:
        assert isinstance(e.cause, NonConvergenceError)
        assert "without reaching a fixpoint" in str(e.cause) and "once=True" in str(e.cause)
    else:  # pragma: no cover
        raise AssertionError("expected non-convergence")
    assert gm.code == before  # the pipeline put the graph back


def test_overlaps_resolved_first_root_first_rule():
    gm = _chain(3)
    first = Rule(P(torch.relu, P(torch.relu, x)), lambda x: torch.sigmoid(x), name="first")
    second = Rule(P(torch.relu, P(torch.relu, x)), lambda x: torch.tanh(x), name="second")
    result = rewrite(gm, [first, second], once=True)
    assert result.rewrites == 1 and result.stats["second"].rewritten == 0
    ops = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert ops == [torch.sigmoid, torch.relu]  # the earliest root (relu_1) won


def test_a_node_only_tries_rules_for_its_op():
    ep, _ = exported_arith()
    mul = Rule(P(aten.mul.Tensor, x, 1), lambda x: x, name="mul")
    neg = Rule(P(aten.neg.default, P(aten.neg.default, x)), lambda x: x, name="neg")
    result = rewrite(ep.graph_module, [mul, neg], once=True)
    muls = count(ep.graph_module, aten.mul.Tensor) + 1
    assert result.stats["mul"].tried == muls  # the mul nodes, not every node
    assert result.stats["neg"].tried == 2


def test_statistics_reach_the_report_and_instrumentation_sees_each_change():
    ep, _ = exported_arith()
    events = []

    class Spy(fp.core.Instrumentation):
        def on_change(self, event, ctx):
            events.append((event.kind, event.rule, [n.name for n in event.old]))

    ids = rules(
        "ids", [(P(aten.mul.Tensor, x, 1), lambda x: x), (P(aten.add.Tensor, x, 0), lambda x: x)]
    )
    result = fp.Pipeline([ids]).run(ep.graph_module, instrument=[Spy()])
    assert [e[0] for e in events] == ["replace", "replace"]
    assert {e[1] for e in events} == {r.name for r in ids}
    rec = result.report.find("ids")
    assert (
        rec.stats["rewrites"] == 2
        and sum(v for k, v in rec.stats.items() if k.endswith(".matched")) == 2
    )


def test_debug_counter_stops_after_k_rewrites():
    gm = _chain(8)
    fp.Pipeline([rules("r", [DOUBLE_RELU])]).run(gm, debug_counter=fp.core.DebugCounter(count=2))
    assert count(gm, torch.relu) == 6


def test_rewrite_inside_a_pass_function_is_atomic_per_pass():
    ep, args = exported_arith()
    expected = run(ep, args)

    def broken(gm):
        rewrite(gm, [(P(aten.mul.Tensor, x, 1), lambda x: x)])
        raise RuntimeError("after one rewrite")

    before = ep.graph_module.code
    with pytest.raises(fp.PassFailedError, match="after one rewrite"):
        fp.Pipeline([broken]).run(ep.graph_module)
    assert ep.graph_module.code == before
    torch.testing.assert_close(run(ep, args), expected)


# ----- fuzzed graphs ------------------------------------------------------------------------
ALGEBRA = rules(
    "algebra",
    [
        (P(torch.mul, x, 1), lambda x: x),
        (P(torch.add, x, 0), lambda x: x),
        (P(torch.neg, P(torch.neg, x)), lambda x: x),
        (P(torch.add, x, x), lambda x: torch.mul(x, 2)),
        (P(torch.sub, x, x), lambda x: torch.mul(x, 0)),
        (P(torch.relu, P(torch.relu, x)), lambda x: torch.relu(x)),
    ],
)


@st.composite
def _programs(draw):
    steps = []
    for i in range(draw(st.integers(2, 14))):
        kind = draw(st.sampled_from(["mul1", "add0", "neg", "relu", "add", "sub", "mul"]))
        steps.append((kind, draw(st.integers(0, i + 1)), draw(st.integers(0, i + 1))))
    return steps


def _build(steps):
    g = torch.fx.Graph()
    vals = [g.placeholder("a"), g.placeholder("b")]
    for kind, i, j in steps:
        a, b = vals[i], vals[j]
        if kind == "mul1":
            vals.append(g.call_function(torch.mul, (a, 1)))
        elif kind == "add0":
            vals.append(g.call_function(torch.add, (a, 0)))
        elif kind == "neg":
            vals.append(g.call_function(torch.neg, (a,)))
        elif kind == "relu":
            vals.append(g.call_function(torch.relu, (a,)))
        else:
            vals.append(g.call_function(getattr(torch, kind), (a, b)))
    g.output((vals[-1], vals[len(vals) // 2]))
    return torch.fx.GraphModule(torch.nn.Module(), g)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_programs(), st.booleans())
def test_fuzzed_graphs_compute_the_same_values(steps, once):
    gm = _build(steps)
    a, b = torch.randn(6), torch.randn(6)
    expected = gm(a, b)
    rewrite(gm, ALGEBRA, once=once)
    gm.graph.lint()
    gm.recompile()
    for got, want in zip(gm(a, b), expected):
        torch.testing.assert_close(got, want)
    if not once:  # at the fixpoint, no rule matches anywhere
        assert rewrite(gm, ALGEBRA).rewrites == 0


def test_rules_written_for_aten_rewrite_edge_programs():
    """The op index finds the Edge spellings of the root op; the compiled matcher takes them;
    what the replacement adds to an Edge graph is Edge."""
    edge = pytest.importorskip("_edge")  # skips where executorch is not installed
    from fxpass.fxutil.dialect import is_edge_op

    ep, args = edge.edge_program("llama"), edge.example_inputs("llama")
    expected = ep.module()(*args)
    half = Rule(P(aten.mul.Scalar, P.node("x"), 0.5), lambda x: aten.div.Tensor(x, 2.0))
    assert rewrite(ep.graph_module, [half], once=True).rewrites == 4  # q and k, per layer
    assert half._compiled is not None  # straight-line code, Edge targets included
    divs = [n for n in ep.graph.nodes if "div" in str(n.target)]
    assert len(divs) == 4 and all(is_edge_op(n.target) for n in divs)
    ep.graph_module.recompile()
    torch.testing.assert_close(ep.module()(*args), expected)


def test_a_rule_that_tried_many_and_matched_few_reports_its_near_misses():
    from cli_targets import strict_add_norm, tiny_fp32  # tests/cli: a strict rule, a graph

    report = fp.Pipeline([strict_add_norm]).run(tiny_fp32().graph_module).report
    (hint,) = report.find("strict_add_norm").hints
    assert "rule 'strict' was tried at" in hint and "3 near misses" in hint
    assert "extra user: %to_" in hint and "fxpass.rewrite.explain(rule, gm)" in hint
    assert "hint: strict_add_norm: " in str(report)
    assert fp.Report.from_dict(report.to_dict()).find("strict_add_norm").hints == [hint]
    library = fp.Pipeline(["fuse_add_rmsnorm"]).run(tiny_fp32().graph_module).report
    assert library.find("fuse_add_rmsnorm").stats["rewrites"] == 4
    # every site fused: nothing to say (a hint is found when read, and reads empty)
    assert not [h for h in library.find("fuse_add_rmsnorm").hints if str(h)]
    assert "hint:" not in str(library)
