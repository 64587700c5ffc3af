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

Modules, top down (each imports only those below it):
:mod:`~fxpass.rewrite.driver` (fixpoint and single-walk drivers; rule sets, which are passes;
:mod:`~fxpass.rewrite.reach`, the nodes a rule can be rooted at),
:mod:`~fxpass.rewrite.guided` (the walk a client's :class:`Guide` steers: its node order,
what it tries where, what it does with a match),
:mod:`~fxpass.rewrite.explain` (why a rule did not match: the explaining matcher),
:mod:`~fxpass.rewrite.rule` (rules as data), :mod:`~fxpass.rewrite.match` (the op-indexed
matcher in front of :mod:`~fxpass.rewrite.interpreted`, the interpreted matcher,
:mod:`~fxpass.rewrite.compile`, the compiled one, and :mod:`~fxpass.rewrite.specialize`,
the interpreter specialized to one rule's pattern; :mod:`~fxpass.rewrite.torchlike`, torch's
matching rules), :mod:`~fxpass.rewrite.region` (a match as a value, whole-match checks),
:mod:`~fxpass.rewrite.pattern` (the pattern language as data), with
:mod:`~fxpass.rewrite.arguments` (arguments laid out by op schema),
:mod:`~fxpass.rewrite.constraint` (literals and ``meta['val']`` checks),
:mod:`~fxpass.rewrite.spelling` (op names and sets);
:mod:`~fxpass.rewrite.rewriter` (the one place that edits the graph),
:mod:`~fxpass.rewrite.metadata` (values and provenance of new nodes),
:mod:`~fxpass.rewrite.order` (topological positions, the local cycle check),
:mod:`~fxpass.rewrite.traced` (patterns written as PyTorch functions).
"""

from __future__ import annotations

from .driver import RewriteResult, RuleSet, rewrite, rules
from .explain import Explanation, GraphExplanation, explain
from .guided import Choice, Guide, Replace, Surgery, guided
from .match import Matcher, RuleStats
from .pattern import P, Pattern
from .region import Match
from .rewriter import ReplacementTypeError, RewriteError, Rewriter
from .rule import DROPPABLE_USERS, GraphReplacement, Rule
from .spelling import CAST_OPS
from .traced import IRS, Replacement, TraceError, trace, traced_rule

__all__ = [
    "CAST_OPS",
    "Choice",
    "DROPPABLE_USERS",
    "Explanation",
    "GraphExplanation",
    "GraphReplacement",
    "Guide",
    "IRS",
    "Match",
    "Matcher",
    "P",
    "Pattern",
    "Replace",
    "Replacement",
    "ReplacementTypeError",
    "RewriteError",
    "RewriteResult",
    "Rewriter",
    "Rule",
    "RuleSet",
    "RuleStats",
    "Surgery",
    "TraceError",
    "explain",
    "guided",
    "rewrite",
    "rules",
    "trace",
    "traced_rule",
]
