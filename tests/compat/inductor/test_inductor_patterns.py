"""Inductor's matching rules, differentially: each pattern is registered with
``register_graph_pattern`` in Inductor's ``PatternMatcherPass`` and in fxpass's, applied to
the same graph, and must match the same nodes with the same ``args``, ``kwargs``, ``nodes``
and outputs (literals, user counts, repeated names, multi-output, lists, exclusive and
variadic arguments, keyword normalization, overlaps, mutation regions)."""

from __future__ import annotations

import copy
import operator

import pytest
import torch
from _ind_support import MATCHERS, make_graph, pattern_matcher

import fxpass.compat.inductor as fxi

aten = torch.ops.aten


def _name(v):
    if isinstance(v, torch.fx.Node):
        return v.name
    if isinstance(v, (list, tuple)):
        return type(v)(_name(x) for x in v)
    return v


def record(pm, pattern, gm, *, check=None):
    """Apply ``pattern`` (a function of the pattern-matcher module) to a copy of ``gm``;
    returns (count, what each handler call saw)."""
    gm = copy.deepcopy(gm)
    p = pm.PatternMatcherPass()
    seen = []
    kwargs = {} if check is None else {"extra_check": check}

    @pm.register_graph_pattern(pattern(pm), pass_dict=p, **kwargs)
    def handler(match, *args, **kw):
        seen.append(
            (
                _name(list(args)),
                {k: _name(v) for k, v in kw.items()},
                [n.name for n in match.nodes],
                [_name(n) for n in match.output_nodes()],
            )
        )

    return p.apply(gm.graph), seen


def agree(pattern, gm, **kw):
    """The two matchers' results, asserted equal; returns them."""
    ours = record(fxi, pattern, gm, **kw)
    theirs = record(pattern_matcher("inductor"), pattern, gm, **kw)
    assert ours == theirs
    return ours


def x_(*shape):
    return torch.randn(*shape)


def test_literals_compare_by_equality_and_nodes_never_equal_literals():
    def f(x, y):
        return (x + 1) * (y + 2) + (x + 1.0)

    gm = make_graph(f, x_(4), x_(4))
    assert agree(lambda pm: pm.CallFunction(aten.add.Tensor, pm.Arg(), 1), gm)[0] == 2
    assert agree(lambda pm: pm.CallFunction(aten.add.Tensor, pm.Arg(), 2), gm)[0] == 1
    assert agree(lambda pm: pm.CallFunction(aten.add.Tensor, pm.Arg(), pm.Arg()), gm)[0] == 4

    def mul_second(pm):
        return pm.CallFunction(
            aten.add.Tensor, pm.Arg(), pm.CallFunction(aten.mul.Tensor, pm.Arg(), pm.Arg())
        )

    assert agree(mul_second, gm)[0] == 0  # the mul is the add's first operand: no commuting


def test_an_inner_node_must_have_the_users_the_pattern_gives_it():
    def f(x):
        a = torch.sin(x)
        return torch.cos(a) + a, torch.cos(torch.sin(x * 2))

    gm = make_graph(f, x_(4))
    one = lambda pm: pm.CallFunction(aten.cos.default, pm.CallFunction(aten.sin.default, pm.Arg()))  # noqa: E731
    assert agree(one, gm)[0] == 1
    many = lambda pm: pm.CallFunction(  # noqa: E731
        aten.cos.default, pm.CallFunction(aten.sin.default, pm.Arg(), _users=pm.MULTIPLE)
    )
    assert agree(many, gm)[0] == 2
    two = lambda pm: pm.CallFunction(  # noqa: E731
        aten.cos.default, pm.CallFunction(aten.sin.default, pm.Arg(), _users=2)
    )
    assert agree(two, gm)[0] == 1


def test_args_come_depth_first_and_names_must_agree():
    def f(x, y):
        return x * (y + x), x * (x + x)

    gm = make_graph(f, x_(3), x_(3))
    count, seen = agree(
        lambda pm: pm.CallFunction(
            aten.mul.Tensor, pm.Arg(), pm.CallFunction(aten.add.Tensor, pm.Arg(), pm.Arg())
        ),
        gm,
    )
    assert count == 2 and seen[-1][0] == ["x_1", "y_1", "x_1"]
    count, seen = agree(
        lambda pm: pm.CallFunction(
            aten.mul.Tensor,
            pm.KeywordArg("x"),
            pm.CallFunction(aten.add.Tensor, pm.KeywordArg("x"), pm.KeywordArg("x")),
        ),
        gm,
    )
    assert count == 1 and seen[0][1] == {"x": "x_1"}


def test_one_pattern_object_meets_one_node():
    def f(x, y):
        return torch.sin(x) * torch.sin(y), torch.sin(x) * torch.sin(x)

    gm = make_graph(f, x_(3), x_(3))

    def shared(pm):
        s = pm.CallFunction(aten.sin.default, pm.Arg(), _users=pm.MULTIPLE)
        return pm.CallFunction(aten.mul.Tensor, s, s)

    assert agree(shared, gm)[0] == 0  # make_fx computes sin(x) twice: two nodes
    fresh = lambda pm: pm.CallFunction(  # noqa: E731
        aten.mul.Tensor,
        pm.CallFunction(aten.sin.default, pm.Arg()),
        pm.CallFunction(aten.sin.default, pm.Arg()),
    )
    assert agree(fresh, gm)[0] == 2


def test_multi_output_patterns_find_their_other_outputs_from_the_first():
    def f(x, y):
        s = x + y
        return torch.relu(s) * 2, torch.sigmoid(s)

    gm = make_graph(f, x_(5), x_(5))

    def both(pm):
        s = pm.CallFunction(aten.add.Tensor, pm.KeywordArg("x"), pm.KeywordArg("y"), _users=2)
        return pm.MultiOutputPattern(
            [pm.CallFunction(aten.relu.default, s), pm.CallFunction(aten.sigmoid.default, s)]
        )

    count, seen = agree(both, gm)
    assert count == 1 and seen[0][3] == ["relu", "sigmoid"]


def test_lists_of_patterns_bundle_their_args():
    def f(a, b, c):
        return torch.cat([torch.mm(a, b), torch.mm(b, c), torch.mm(a, c)], 1)

    gm = make_graph(f, x_(4, 4), x_(4, 4), x_(4, 4))
    count, seen = agree(
        lambda pm: pm.CallFunction(
            aten.cat.default,
            pm.ListOf(pm.CallFunction(aten.mm.default, pm.Arg(), pm.Arg())),
            pm.Arg(),
        ),
        gm,
    )
    assert count == 1
    assert seen[0][0][0] == (("a_1", "b_1"), ("b_1", "c_1"), ("a_1", "c_1"))


def test_exclusive_arguments_never_share_a_value():
    def f(x, y):
        return x * x, x * y

    gm = make_graph(f, x_(3), x_(3))
    pattern = lambda pm: pm.CallFunction(  # noqa: E731
        aten.mul.Tensor, pm.ExclusiveKeywordArg("a"), pm.ExclusiveKeywordArg("b")
    )
    count, seen = agree(pattern, gm)
    assert count == 1 and seen[0][1] == {"a": "x_1", "b": "y_1"}


def test_variadic_patterns_pass_the_node_arguments():
    def f(x):
        return torch.sum(x, [0], keepdim=True) + torch.sum(x)

    gm = make_graph(f, x_(3, 3))
    count, seen = agree(lambda pm: pm.CallFunctionVarArgs(aten.sum.dim_IntList), gm)
    assert count == 1 and seen[0][0] == ["x_1", [0], True]


def test_keywords_the_node_lacks_are_normalized_from_the_schema():
    def f(inp, a, b):
        return aten.addmm(inp, a, b), aten.addmm(inp, a, b, beta=0.5)

    gm = make_graph(f, x_(4), x_(3, 5), x_(5, 4))
    count, seen = agree(
        lambda pm: pm.CallFunction(
            aten.addmm, pm.Arg(), pm.Arg(), pm.Arg(), beta=pm.KeywordArg("beta")
        ),
        gm,
    )
    assert count == 2 and sorted(s[1]["beta"] for s in seen) == [0.5, 1]


def test_overlapping_sites_are_taken_from_the_last():
    def f(x):
        return torch.sin(torch.sin(torch.sin(torch.sin(x))))

    gm = make_graph(f, x_(3))
    count, _ = agree(
        lambda pm: pm.CallFunction(aten.sin.default, pm.CallFunction(aten.sin.default, pm.Arg())),
        gm,
    )
    assert count == 3  # handlers that change nothing leave every site to be seen


def test_a_match_never_spans_a_mutation():
    def f(x, y):
        a = torch.sin(x)
        x.add_(y)
        return a + x

    gm = torch.fx.symbolic_trace(f)

    def pattern(pm):
        return pm.CallFunction(operator.add, pm.CallFunction(torch.sin, pm.Arg()), pm.Arg())

    assert agree(pattern, gm)[0] == 0


def test_call_method_patterns_match_method_nodes():
    def f(x):
        return x.relu().sum()

    gm = torch.fx.symbolic_trace(f)
    count, _ = agree(lambda pm: pm.CallMethod("sum", pm.CallMethod("relu", pm.KeywordArg("x"))), gm)
    assert count == 1


def test_extra_check_sees_the_match():
    def f(x, y):
        return x + y, y + 3.0

    gm = make_graph(f, x_(3), x_(3))

    def check(match):
        return isinstance(match.kwargs["b"], torch.fx.Node)

    pattern = lambda pm: pm.CallFunction(aten.add.Tensor, pm.KeywordArg("a"), pm.KeywordArg("b"))  # noqa: E731
    assert agree(pattern, gm, check=check)[0] == 1


@pytest.mark.parametrize("matcher", MATCHERS)
def test_pattern_objects_print_and_compare_as_inductor_s(matcher):
    pm = pattern_matcher(matcher)
    p = pm.CallFunction(aten.add.Tensor, pm.KeywordArg("x"), 1, _users=pm.MULTIPLE)
    q = pm.CallFunction(aten.add.Tensor, pm.KeywordArg("x"), 1, _users=pm.MULTIPLE)
    assert repr(p) == "CallFunction(aten.add.Tensor, KeywordArg('x'), 1, _users=MULTIPLE)"
    assert p.pattern_eq(q) and not p.pattern_eq(pm.CallFunction(aten.add.Tensor, pm.Arg(), 1))
    gm = make_graph(lambda x: x + 2, x_(3))
    node = gm.graph.find_nodes(op="call_function", target=aten.add.Tensor)[0]
    failed = p.match(node)
    assert not failed and "constant_args" in str(failed)
    m = pm.CallFunction(aten.add.Tensor, pm.KeywordArg("x"), pm.Ignored()).match(node)
    assert m and m.kwargs == {"x": node.args[0]} and m.nodes == [node]


def test_fxpass_patterns_reject_what_cannot_be_a_pattern():
    with pytest.raises(TypeError, match="KeywordArg"):
        fxi.KeywordArg(3)
    with pytest.raises(TypeError, match="MultiOutputPattern"):
        fxi.MultiOutputPattern([fxi.KeywordArg("x")])
    with pytest.raises(TypeError, match="ListOf"):
        fxi.ListOf("x")
    p = fxi.PatternMatcherPass()
    with pytest.raises(TypeError, match="must start with"):
        fxi.register_graph_pattern(fxi.KeywordArg("x"), pass_dict=p)(lambda match, x: None)
    with pytest.raises(RuntimeError, match="GraphModule or a Graph"):
        fxi.register_graph_pattern(fxi.CallFunction(aten.add.Tensor, fxi.Arg(), 1), pass_dict=p)(
            lambda match, x: None
        )
        p.apply(object())
