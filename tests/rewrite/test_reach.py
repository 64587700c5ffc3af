"""Reach: a rule is tried only near the ops every match of it contains, and finds the same
matches (also where an earlier rewrite brings such an op closer)."""

from __future__ import annotations

import torch
from _rewrite_helpers import count

from fxpass.passes.fusion.fuse_rmsnorm import RULES as NORM_RULES
from fxpass.rewrite import P, Rule, rewrite
from fxpass.rewrite.reach import Reach, requirement

from _models import exported_gm

aten = torch.ops.aten
x = P.var("x")


def test_a_norm_of_any_spelling_is_found_near_its_rsqrt():
    gm = exported_gm(remove_asserts=True)  # core ATen: rsqrt, no sqrt, no fxpass ops
    ops, depth = requirement(NORM_RULES.rules[0].roots[0], gm.graph)
    assert aten.rsqrt.default in ops and aten.mul.Tensor not in ops
    # cast(w * cast(h * rsqrt(...))) puts the rsqrt four ops below the root, but the
    # h * pow(mean(h**2) + eps, -0.5) spelling has no rare op of its own (the graph calls pow
    # for h**2), so its nearest required op is the mean, six ops below the root
    assert aten.pow.Tensor_Scalar not in ops and aten.mean.dim in ops
    assert depth == 6
    reach = Reach(gm.graph)
    rule = NORM_RULES.rules[0]
    muls = list(gm.graph.find_nodes(op="call_function", target=aten.mul.Tensor))
    near = [n for n in muls if reach.may_match(rule, n)]
    assert 0 < len(near) < len(muls) / 2
    matched = [n for n in muls if rule.match(n) is not None]
    assert matched and all(reach.may_match(rule, n) for n in matched)


def test_a_pattern_without_ops_can_match_anywhere():
    gm = exported_gm(remove_asserts=True)
    assert requirement(P.var("anything"), gm.graph) is None
    assert requirement(P.any_of(P(aten.neg.default, x), x), gm.graph) is None


class _Far(torch.nn.Module):
    """One relu of an rsqrt, three uses away from it, and relus of other values (so the rsqrt
    is the rarer op to look for)."""

    def forward(self, a):
        others = torch.relu(a) + torch.relu(a * 2) + torch.relu(a * 3)
        return torch.relu(torch.neg(torch.neg(torch.rsqrt(a)))) + others


def test_a_rewrite_that_brings_the_op_closer_is_seen():
    # relu(rsqrt(.)) is three uses away from the rsqrt until neg(neg(y)) -> y makes it one
    gm = torch.export.export(_Far(), (torch.rand(4) + 1,)).run_decompositions().graph_module
    rules = [
        Rule(P(aten.neg.default, P(aten.neg.default, x)), lambda x: x, name="negneg"),
        Rule(
            P(aten.relu.default, P(aten.rsqrt.default, x)),
            lambda x: aten.sqrt.default(x),
            name="rr",
        ),
    ]
    assert requirement(rules[1].roots[0], gm.graph) == (frozenset([aten.rsqrt.default]), 1)
    result = rewrite(gm, rules, once=True)
    assert result.rewrites == 2
    assert count(gm, aten.sqrt.default) == 1 and count(gm, aten.relu.default) == 3
    assert result.stats["rr"].tried == 4 and result.stats["rr"].matched == 1
