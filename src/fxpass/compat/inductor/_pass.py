"""``PatternMatcherPass``: registered patterns, applied to a graph in one walk.

``apply(graph)`` visits the nodes calling a registered op from the last to the first (as
Inductor does), tries that op's entries in registration order, and applies each match whose
nodes lie in one mutation region and on one stream and whose ``extra_check`` holds; it
returns the number of matches applied. Matching is fxpass's (:mod:`._matching`), every
replacement goes through fxpass's rewriter and editor (debug counter, change events,
provenance), and nothing is traced per match.

With the improvements on (``PatternMatcherPass(improve=True)``, or
:func:`~fxpass.compat.inductor.set_improvements`), a node Inductor's rules reject is tried
again by the relaxed ones; ``stats.extra`` counts what only they found, and inside an fxpass
pipeline the run's report gets ``matches`` and ``extra_sites``.
"""

from __future__ import annotations

import os
import time
from bisect import bisect_right
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx
from torch.fx import Node
from torch.fx.experimental.symbolic_shapes import guard_or_false

from ...core.context import current_context
from ...edit.watch import watch_edits
from ...fxutil.fx_internals import is_erased, sort_key
from ...rewrite.match import MatchState
from ...rewrite.region import lazy_order
from ...rewrite.rewriter import Rewriter
from ._entry import GraphPatternEntry, PatternEntry, debug_node, explain_failure, find, log
from ._explain import PassExplanation, explain_pass, miss_hints
from ._matching import dependent_values
from ._options import improvements_on
from ._regions import is_mutation_op, unsupported_node

__all__ = ["ApplyStats", "PatternMatcherPass"]


@dataclass
class ApplyStats:
    """What the last ``apply`` did: ``matches`` applied, of which ``extra`` only the
    improvements found, per entry (``by_entry``: name -> (tried, matched)), and the time."""

    matches: int = 0
    extra: int = 0
    by_entry: dict[str, list[int]] = field(default_factory=dict)
    seconds: float = 0.0

    def __str__(self) -> str:
        lines = [f"{self.matches} matches ({self.extra} extra) in {self.seconds * 1000:.1f} ms"]
        for name, (tried, matched) in self.by_entry.items():
            lines.append(f"  {name}: tried {tried}, matched {matched}")
        return "\n".join(lines)


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

    def call(self, gm: fx.GraphModule) -> bool:
        """The fxpass pass contract: apply, and say whether anything changed."""
        return self.apply(gm) > 0

    def apply(self, gm: fx.GraphModule | fx.Graph) -> int:
        """Apply all registered patterns to the graph; returns the number of matches."""
        if not self.patterns:
            return 0
        graph, gm = _graph_of(gm)
        run = _Run(self, gm, graph)
        t0 = time.perf_counter()
        for node in run.candidates():
            key = (node.op, _target(node))
            if run.improve and key[1] is _AF_V2:
                key = (node.op, _AF)
            if node.op == "call_module" and key not in self.patterns:
                continue
            for entry in self.patterns[key]:
                if is_erased(node):
                    break
                run.try_entry(entry, node)
        run.stats.seconds = time.perf_counter() - t0
        self.stats = run.stats
        run.report()
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


def _target(node: Node) -> Any:
    """Inductor's key of a node: its target, or a called module's class."""
    if node.op == "call_module":
        owner = node.graph.owning_module
        if owner is None:
            raise AssertionError("node.graph.owning_module must not be None")
        return type(owner.get_submodule(node.target))
    return node.target


_BACKEND = os.environ.get("TORCHINDUCTOR_PATTERN_MATCH_BACKEND", "inductor")
_WALK = 256
_AF = torch.ops.higher_order.auto_functionalized
_AF_V2 = (
    torch.ops.higher_order.auto_functionalized_v2
)  # a match spanning more nodes is checked against the list of mutating ops


class _Run:
    """One ``apply``: the rewriter, the match state, the mutation regions, the statistics."""

    def __init__(self, owner: PatternMatcherPass, gm: Any, graph: fx.Graph) -> None:
        self.owner = owner
        self.graph = graph
        self.improve = owner._improving()
        name = owner.pass_name if owner.pass_name is not None else "pattern_matcher"
        self.rewriter = Rewriter(gm if gm is not None else graph, pass_name=name)
        self.state = MatchState(order=lazy_order(graph))
        self.stats = ApplyStats()
        self.entry_name = name
        self._mutations: list[Any] | None = None
        from torch._dynamo.utils import counters
        from torch._inductor import config

        self.counters = counters
        self.cpp = config.disable_cpp_codegen
        self._skips: dict[Node, bool] = {}
        self.debug = os.environ.get("TORCHINDUCTOR_PATTERN_MATCH_DEBUG") or None

    def candidates(self) -> list[Node]:
        nodes: list[Node] = []
        modules = False
        graph = self.graph
        for op, target in self.owner.patterns:
            if op == "call_module":
                modules = True
            else:
                nodes.extend(graph.find_nodes(op=op, target=target, sort=False))
                if self.improve and target is _AF:  # the v2 nodes functionalization makes
                    nodes.extend(graph.find_nodes(op=op, target=_AF_V2, sort=False))
        if modules:
            nodes.extend(graph.find_nodes(op="call_module", sort=False))
        return sorted(set(nodes), key=sort_key, reverse=True)

    def skip(self, node: Node) -> bool:
        """Inductor leaves nodes it would not lower alone (meta, complex, sparse tensors...);
        the improvements keep meta tensors (graphs matched before they hold data). Asked
        once a pattern matches there (the verdict does not depend on the pattern), and
        remembered for the node."""
        verdict = self._skips.get(node)
        if verdict is None:
            verdict = self._skips[node] = unsupported_node(
                node, allow_meta=self.improve, cpp=self.cpp
            )
        return verdict

    # ----- one entry at one node ----------------------------------------------------------
    def try_entry(self, entry: PatternEntry, node: Node) -> None:
        name = entry.entry_name
        self.entry_name = name
        tally = self.stats.by_entry.setdefault(name, [0, 0])
        tally[0] += 1
        debug = self.debug is not None and debug_node(node.name, self.debug)
        if debug and self.skip(node):
            return
        m = find(entry.pattern, node, self.state, self.improve)
        if debug:
            shown = m if m is not None else explain_failure(entry.pattern, node, self.improve)
            log.warning("%s%s %s %s", node, node.args, shown, entry.pattern)
        if m is None or self.skip(node):
            return
        if not self.one_region(m.nodes) or not _one_stream(m.nodes):
            return
        m.run = self
        if (
            isinstance(entry, GraphPatternEntry)
            and m.found is not None
            and not m.extra
            and dependent_values(m.found)
        ):  # a bound value computed from the match's nodes: what the handler reads is unknown
            return
        if not _truthy(entry.extra_check(m)):
            return
        if not self.rewriter.editor.allow():
            return
        self.stats.matches += 1
        self.stats.extra += int(m.extra)
        tally[1] += 1
        c = self.counters[_BACKEND]
        c["pattern_matcher_count"] += 1
        c["pattern_matcher_nodes"] += len(m.nodes)
        if isinstance(entry, GraphPatternEntry):
            rewrites = self.rewriter.rewrites
            with self.tracked() as changes:
                entry.apply(m, self.graph, node)
            surgery = self.rewriter.rewrites == rewrites  # else the rewriter told already
            if surgery and (changes.created or changes.erased):
                self.rewriter.editor.notify("replace", name, changes.erased, changes.created)
            if changes.mutation:
                self._mutations = None
        else:
            entry.apply(m, self.graph, node)

    # ----- mutation regions ---------------------------------------------------------------
    def one_region(self, nodes: list[Node]) -> bool:
        """Whether no mutating op lies after the first of ``nodes`` up to the last (Inductor:
        all in one mutation region). Walks the span of the match; a long one looks the
        mutating ops up in a sorted list of them instead."""
        if len(nodes) < 2:
            return True
        lo = min(nodes, key=sort_key)
        hi = max(nodes, key=sort_key)
        n, steps = lo.next, 0
        while n is not hi and steps < _WALK:
            if is_mutation_op(n):
                return False
            n, steps = n.next, steps + 1
        if n is hi:
            return not is_mutation_op(hi)
        keys = self._mutation_keys()
        return bisect_right(keys, sort_key(hi)) == bisect_right(keys, sort_key(lo))

    def _mutation_keys(self) -> list[Any]:
        if self._mutations is None:
            self._mutations = [sort_key(n) for n in self.graph.nodes if is_mutation_op(n)]
        return self._mutations

    def replaced(self, old: list[Node], new: list[Node]) -> None:
        """After a replacement: mutation regions move if it added or removed a mutating op."""
        if (self._mutations and any(is_mutation_op(n) for n in old)) or any(
            is_mutation_op(n) for n in new
        ):
            self._mutations = None

    @contextmanager
    def tracked(self) -> Iterator[_Changes]:
        """What a handler creates and erases (it edits the graph itself): watched with
        :func:`~fxpass.edit.watch.watch_edits`."""
        changes = _Changes()

        def created(n: Node) -> None:
            changes.created.append(n)
            changes.mutation |= is_mutation_op(n)

        def erased(n: Node) -> None:
            changes.erased.append(n)
            changes.mutation |= is_mutation_op(n)

        with watch_edits(self.graph, created, erased):
            yield changes
        changes.created = [n for n in changes.created if not is_erased(n)]

    # ----- the report ----------------------------------------------------------------------
    def report(self) -> None:
        ctx = current_context()
        if ctx is None:
            return
        ctx.stat("matches", self.stats.matches)
        ctx.stat("extra_sites", self.stats.extra)
        for name, (tried, matched) in self.stats.by_entry.items():
            ctx.stat(f"{name}.tried", tried)
            ctx.stat(f"{name}.matched", matched)
        record = ctx.record
        if record is not None:
            record.hints.extend(
                miss_hints(self.owner.patterns, self.graph, self.stats, self.improve)
            )


@dataclass
class _Changes:
    created: list[Node] = field(default_factory=list)
    erased: list[Node] = field(default_factory=list)
    mutation: bool = False


def _one_stream(nodes: list[Node]) -> bool:
    streams = {n.meta.get("custom", {}).get("stream", 0) for n in nodes}
    return len(streams) <= 1


def _truthy(value: Any) -> bool:
    return bool(guard_or_false(value))
