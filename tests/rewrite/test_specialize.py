"""Specialized matchers: the library's rules with alternatives find, node for node, the
matches the interpreter finds (same bindings, same nodes, same choice among several)."""

from __future__ import annotations

import pytest
import torch

from fxpass.distributed.fuse_allreduce_add_rmsnorm import RULES as ALLREDUCE_RULES
from fxpass.passes.fusion.fuse_add_rmsnorm import RULES as ADD_NORM_RULES
from fxpass.passes.fusion.fuse_add_rmsnorm_quant import RULES as QUANT_RULES
from fxpass.passes.fusion.fuse_rmsnorm import RULES as NORM_RULES
from fxpass.rewrite import P, Rule
from fxpass.rewrite._state import MatchState
from fxpass.rewrite.compile import compile_rule
from fxpass.rewrite.interpret import Interpreter
from fxpass.rewrite.match import attempt
from fxpass.rewrite.region import lazy_order
from fxpass.rewrite.specialize import specialize_rule

from _models import exported_gm

aten = torch.ops.aten
LIBRARY = [*NORM_RULES, *ADD_NORM_RULES, *QUANT_RULES, *ALLREDUCE_RULES]
a, b = P.var("a"), P.var("b")
# two ways to match mul(x, x * y): the operand order decides which binds first
AMBIGUOUS = Rule(
    P.any_of(P(aten.mul.Tensor, a, P(aten.mul.Tensor, a, b)), P(aten.mul.Tensor, a, b)),
    lambda **kw: None,
    name="ambiguous",
)


@pytest.mark.parametrize("config", [{}, {"norm_style": "gemma", "sandwich_norm": True}])
@pytest.mark.parametrize("rule", [*LIBRARY, AMBIGUOUS], ids=lambda r: r.name)
def test_specialized_and_interpreted_matchers_find_the_same_matches(rule, config):
    gm = exported_gm(remove_asserts=True, decompose=not config, **config)
    order = lazy_order(gm.graph)
    if compile_rule(rule) is None:  # the straight-line compiler takes the rest
        assert specialize_rule(rule) is not None
    plain = Interpreter()
    for node in gm.graph.nodes:
        st, ref = MatchState(order=order), MatchState(order=order)
        ok = attempt(rule, node, st)
        ref.reset()
        ref.roots = [node]
        assert ok == plain.match_rule(rule, node, ref), node.name
        if ok:
            assert st.found.bindings == ref.found.bindings
            assert st.found.nodes == ref.found.nodes
            assert st.found.chains == ref.found.chains


class _Kind(P.var("k").__class__):
    """A pattern class the specializer does not know (as compatibility layers define)."""


def test_a_pattern_class_it_does_not_know_keeps_the_interpreter():
    rule = Rule(P(aten.relu.default, _Kind("x")) | P(aten.neg.default, a), lambda **kw: None)
    assert specialize_rule(rule) is None
