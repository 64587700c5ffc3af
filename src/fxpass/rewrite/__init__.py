"""Pattern rewriting: declarative rules, traced patterns, an op-indexed matcher, drivers.

>>> import torch
>>> from fxpass.rewrite import P, rules, rewrite
>>> aten = torch.ops.aten
>>> x = P.var("x")
>>> simplify = rules("simplify", [
...     (P(aten.mul.Tensor, x, 1), lambda x: x),
...     (P(aten.add.Tensor, x, 0), lambda x: x),
... ])
>>> result = simplify(gm)            # a rule set is a pass    # doctest: +SKIP
>>> rewrite(gm, simplify, once=True) # or drive it directly     # doctest: +SKIP

Modules: :mod:`~fxpass.rewrite.pattern` (the pattern language), :mod:`~fxpass.rewrite.rule`
(rules and rule sets), :mod:`~fxpass.rewrite.match` (matches, the op-indexed matcher),
:mod:`~fxpass.rewrite.driver` (fixpoint and single-walk drivers),
:mod:`~fxpass.rewrite.rewriter` (the one place that edits the graph),
:mod:`~fxpass.rewrite.metadata` (values and provenance of new nodes),
:mod:`~fxpass.rewrite.order` (topological positions, the local cycle check),
:mod:`~fxpass.rewrite.traced` (patterns written as PyTorch functions),
:mod:`~fxpass.rewrite.explain` (why a rule did not match).
"""

from __future__ import annotations

from .driver import RewriteResult, rewrite
from .explain import Explanation, GraphExplanation, explain
from .match import Match, Matcher, RuleStats
from .pattern import CAST_OPS, P, Pattern
from .rewriter import RewriteError, Rewriter
from .rule import DROPPABLE_USERS, Rule, RuleSet, rules
from .traced import IRS, Replacement, TraceError, trace, traced_rule

__all__ = [
    "CAST_OPS",
    "DROPPABLE_USERS",
    "Explanation",
    "GraphExplanation",
    "IRS",
    "Match",
    "Matcher",
    "P",
    "Pattern",
    "Replacement",
    "RewriteError",
    "RewriteResult",
    "Rewriter",
    "Rule",
    "RuleSet",
    "RuleStats",
    "TraceError",
    "explain",
    "rewrite",
    "rules",
    "trace",
    "traced_rule",
]
