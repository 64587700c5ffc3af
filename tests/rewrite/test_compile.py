"""The compiled matcher and the interpreter: one ranking, the same matches."""

from __future__ import annotations

import pytest
import torch

from fxpass.distributed.fuse_allreduce_add_rmsnorm import RULES as ALLREDUCE_RULES
from fxpass.passes.fusion.fuse_add_rmsnorm import RULES as ADD_NORM_RULES
from fxpass.passes.fusion.fuse_add_rmsnorm_quant import RULES as QUANT_RULES
from fxpass.passes.fusion.fuse_rmsnorm import RULES as NORM_RULES
from fxpass.rewrite import P, Rule
from fxpass.rewrite._state import MatchState
from fxpass.rewrite.compile import child_order, compile_rule
from fxpass.rewrite.interpreted import Interpreter
from fxpass.rewrite.match import attempt
from fxpass.rewrite.pattern import P as OpPattern
from fxpass.rewrite.region import lazy_order

from _models import exported_gm

aten = torch.ops.aten
LIBRARY = [*NORM_RULES, *ADD_NORM_RULES, *QUANT_RULES, *ALLREDUCE_RULES]


def _op_patterns(rule):
    for root in rule.roots:
        for p in root.walk():
            if isinstance(p, OpPattern) and len(p.fns) == 1 and not p.packets:
                yield p


@pytest.mark.parametrize("rule", LIBRARY, ids=lambda r: r.name)
def test_both_matchers_try_the_arguments_of_the_library_rules_in_one_order(rule):
    checked = 0
    for p in _op_patterns(rule):
        (target,) = p.fns
        r = p.layout(target)
        if not r.ok:
            continue
        children = list(p.children())
        compiled = [children[k] for k in child_order(children, r.child_slot)]
        compiled = [c for c in compiled if not c.LITERAL and not c.free]
        assert [id(c) for c in compiled] == [id(c) for _, c in r.subs], repr(p)
        checked += 1
    assert checked


def _rules():
    x, w = P.var("x"), P.var("w")
    h = P(aten._to_copy.default, x, dtype=torch.float32)
    var = P(aten.mean.dim, P(aten.pow.Tensor_Scalar, h, 2), [-1], True)
    norm = P(aten.mul.Tensor, h, P(aten.rsqrt.default, P(aten.add.Tensor, var, P.const("eps"))))
    return [
        Rule(P(aten.mul.Tensor, w, P(aten._to_copy.default, norm, ...)), lambda **b: None),
        Rule(
            P(aten.add.Tensor, P.var("a"), P(aten.mul.Tensor, P.var("b"), P.var("c"))),
            lambda **b: None,
        ),
        Rule(P(aten.mul.Tensor, P.var("a"), P.var("a")), lambda a: None),
        Rule(P(aten.add.Tensor, P.node("a"), P.var("b")).named("sum"), lambda **b: None),
    ]


def test_compiled_and_interpreted_matchers_find_the_same_matches():
    gm = exported_gm(remove_asserts=True)
    order = lazy_order(gm.graph)
    plain, found = Interpreter(), 0
    for rule in _rules():
        assert compile_rule(rule) is not None
        for node in gm.graph.nodes:
            st, ref = MatchState(order=order), MatchState(order=order)
            ok = attempt(rule, node, st)
            ref.reset()
            ref.roots = [node]
            assert ok == plain.match_rule(rule, node, ref)
            if ok:
                found += 1
                assert st.found.bindings == ref.found.bindings
                assert st.found.nodes == ref.found.nodes
    assert found
