"""``PatternMatcherPass``: registered patterns, applied to a graph in one walk.

``apply(graph)`` visits the nodes calling a registered op from the last to the first (as
Inductor does), tries that op's entries in registration order, and applies each match whose
nodes lie in one mutation region and on one stream and whose ``extra_check`` holds; it
returns the number of matches applied. ``apply`` declares that policy (:class:`~._guide.
PassRun`) and hands the graph once to rewrite's guided walk (:func:`fxpass.rewrite.guided`),
which matches by fxpass's matcher with Inductor's rules (:mod:`._matching`) and makes every
edit through fxpass's rewriter and editor (debug counter, change events, provenance);
nothing is traced per match.

With the improvements on (``PatternMatcherPass(improve=True)``, or
:func:`~fxpass.compat.inductor.set_improvements`), a node Inductor's rules reject is tried
again by the relaxed ones; ``stats.extra`` counts what only they found, and inside an fxpass
pipeline the run's report gets ``matches`` and ``extra_sites``.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from torch import fx

from ...core.context import PassContext
from ...rewrite import guided
from ._entry import PatternEntry
from ._explain import PassExplanation, explain_pass
from ._guide import ApplyStats, PassRun
from ._options import improvements_on

__all__ = ["ApplyStats", "PatternMatcherPass"]


class PatternMatcherPass:
    """Registry of patterns to match and replace in FX graphs (Inductor's
    ``PatternMatcherPass``; ``improve`` as :func:`set_improvements`, None: the global).

    It is also an fxpass pass (``call(gm)``): in a pipeline, ``fxpass.apply(ep, pm)``, its
    report counts the matches, the extra sites and each pattern's tries and matches, and
    names the near misses of a pattern that matched few of the nodes it was tried at."""

    statistics = {
        "matches": "matches applied",
        "extra_sites": "matches only the improvements found",
        "<pattern>.tried": "nodes each pattern was tried at",
        "<pattern>.matched": "matches each pattern made",
    }

    def __init__(
        self,
        pass_name: str | None = None,
        subsystem: str | None = None,
        *,
        improve: bool | None = None,
    ) -> None:
        self.patterns: defaultdict[tuple[str, Any], list[PatternEntry]] = defaultdict(list)
        self.pass_name = pass_name
        self.subsystem = subsystem
        self.seen_patterns: dict[str, list[str | None]] = defaultdict(list)
        self.improve = improve
        self.stats = ApplyStats()

    def __getitem__(self, item: tuple[str, Any]) -> list[PatternEntry]:
        return self.patterns[item]

    def clear(self) -> None:
        self.patterns.clear()

    def __call__(self, graph: fx.Graph | fx.GraphModule) -> None:
        """Apply the patterns (Inductor calls a pass installed at its post-grad hooks so)."""
        self.apply(graph)

    @property
    def name(self) -> str:
        """The pass's name in fxpass reports."""
        return self.pass_name or "pattern_matcher"

    def call(self, gm: fx.GraphModule, ctx: PassContext | None = None) -> bool:
        """The fxpass pass contract: apply, handed the run's context, and say whether
        anything changed."""
        return self.apply(gm, ctx=ctx) > 0

    def apply(self, gm: fx.GraphModule | fx.Graph, *, ctx: PassContext | None = None) -> int:
        """Apply all registered patterns to the graph; returns the number of matches.
        ``ctx``: the context of the fxpass run applying it (its editor, its report); None
        when Inductor calls it: then the run in progress, if any."""
        if not self.patterns:
            return 0
        graph, gm = _graph_of(gm)
        run = PassRun(self, ctx)  # Inductor's policy; rewrite walks, matches and edits
        guided(gm if gm is not None else graph, run.guide(), pass_name=run.name, ctx=ctx)
        return run.stats.matches

    def explain(self, gm: fx.GraphModule | fx.Graph) -> PassExplanation:
        """Where each registered pattern matches in ``gm`` and, where it does not, its
        closest misses and why (Inductor's rules; the relaxed ones too when improving)."""
        graph, _ = _graph_of(gm)
        return explain_pass(self.patterns, graph, self._improving())

    def _improving(self) -> bool:
        return improvements_on() if self.improve is None else self.improve

    def __repr__(self) -> str:
        n = len({id(e) for entries in self.patterns.values() for e in entries})
        return f"PatternMatcherPass({self.pass_name!r}, {n} patterns)"


def _graph_of(gm: Any) -> tuple[fx.Graph, fx.GraphModule | None]:
    if isinstance(gm, fx.GraphModule):
        return gm.graph, gm
    if isinstance(gm, fx.Graph):
        return gm, gm.owning_module
    raise RuntimeError(
        f"The input to PatternMatcherPass must be a GraphModule or a Graph, but got {type(gm)}"
    )
