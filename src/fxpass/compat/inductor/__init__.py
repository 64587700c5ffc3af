"""Inductor's pattern matcher (``torch._inductor.pattern_matcher``), on fxpass.

``register_replacement``, ``register_graph_pattern``, ``PatternMatcherPass``, the pattern
expressions (``CallFunction``, ``KeywordArg``, ``Arg``, ``MultiOutputPattern``...), ``Match``,
``fwd_only``... take the arguments and give the results of Inductor's — the same matches
by the same rules — but:

* search and replacement functions are traced once (with symbolic sizes), not per match;
  a replacement is replayed with each match's sizes, symbolic ones staying symbolic;
* matching is fxpass's op-indexed matcher, every change goes through fxpass's rewriter
  (debug counter, change events, provenance, metadata), and ``apply`` is tens of times
  faster on layer-stacked models;
* ``pm.explain(gm)`` says why a registered pattern missed where it did;
* opt-in improvements (:func:`set_improvements`, ``PatternMatcherPass(improve=True)``,
  ``install(improve=True)``) match through views and no-op casts and despite intermediates
  used elsewhere; ``pm.stats.extra`` counts the sites only they found.

Use it by importing from here, or leave the code as it is and call :func:`install` first:

>>> import fxpass.compat.inductor as fxi
>>> pm = fxi.install()                # torch._inductor.pattern_matcher is now fxpass's
>>> from torch._inductor.pattern_matcher import register_replacement
>>> register_replacement is fxi.register_replacement
True
>>> fxi.uninstall()                   # Inductor's again

See docs/inductor.md.
"""

from __future__ import annotations

from ._entry import (
    GraphPatternEntry,
    PatternEntry,
    check_and_add_duplicate_pattern,
    register_graph_pattern,
)
from ._explain import PassExplanation, PatternExplanation
from ._exprs import (
    MULTIPLE,
    Arg,
    CallFunction,
    CallFunctionVarArgs,
    CallMethod,
    CallMethodVarArgs,
    CallModule,
    CallModuleVarArgs,
    ExclusiveKeywordArg,
    FailedMatch,
    Ignored,
    KeywordArg,
    ListOf,
    MultiOutputPattern,
    Multiple,
    PatternExpr,
    RepeatedExpr,
)
from ._install_matcher import install, installed, is_installed, uninstall
from ._match import Match, MatchContext
from ._options import improvements, improvements_on, set_improvements
from ._pass import ApplyStats, PatternMatcherPass
from ._pretty import PatternPrettyPrinter
from ._replacement import (
    ReplacementPatternEntry,
    _known_precompiled_patterns,
    gen_pattern,
    gen_pattern_and_search_gm,
    gen_register_replacement,
    register_replacement,
)
from ._trace import fwd_only, fx_to_pattern, joint_fwd_bwd
from ._util import init_once_fakemode, is_match, stable_topological_sort

#: vLLM clears this to register one pattern for several constants; kept for such code (this
#: matcher tells duplicates apart per pass, ``PatternMatcherPass.seen_patterns``).
_seen_patterns: set[str] = set()

__all__ = [
    "ApplyStats",
    "Arg",
    "CallFunction",
    "CallFunctionVarArgs",
    "CallMethod",
    "CallMethodVarArgs",
    "CallModule",
    "CallModuleVarArgs",
    "ExclusiveKeywordArg",
    "FailedMatch",
    "GraphPatternEntry",
    "Ignored",
    "KeywordArg",
    "ListOf",
    "MULTIPLE",
    "Match",
    "MatchContext",
    "MultiOutputPattern",
    "Multiple",
    "PassExplanation",
    "PatternEntry",
    "PatternExplanation",
    "PatternExpr",
    "PatternMatcherPass",
    "PatternPrettyPrinter",
    "RepeatedExpr",
    "ReplacementPatternEntry",
    "check_and_add_duplicate_pattern",
    "fwd_only",
    "fx_to_pattern",
    "gen_pattern",
    "gen_pattern_and_search_gm",
    "gen_register_replacement",
    "improvements",
    "improvements_on",
    "init_once_fakemode",
    "install",
    "installed",
    "is_installed",
    "is_match",
    "joint_fwd_bwd",
    "register_graph_pattern",
    "register_replacement",
    "set_improvements",
    "stable_topological_sort",
    "uninstall",
]

#: The names ``install()`` puts in ``torch._inductor.pattern_matcher`` (Inductor's others stay).
_DROP_IN = {
    name: globals()[name]
    for name in __all__
    if name
    not in (
        "ApplyStats",
        "PassExplanation",
        "PatternExplanation",
        "improvements",
        "improvements_on",
        "install",
        "installed",
        "is_installed",
        "set_improvements",
        "uninstall",
    )
}
_DROP_IN["_seen_patterns"] = _seen_patterns
_DROP_IN["_known_precompiled_patterns"] = _known_precompiled_patterns
