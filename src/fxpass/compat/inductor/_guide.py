"""One ``PatternMatcherPass.apply``: Inductor's policy, as a guide of rewrite's guided walk.

``apply`` hands the graph once to :func:`fxpass.rewrite.guided` with the
:class:`~fxpass.rewrite.Guide` a :class:`PassRun` declares: what Inductor's matcher does,
leaving the walking, the matching and the edits to rewrite — the nodes calling a registered op from the last to the first, that op's entries
in registration order (each Inductor's rules, then, with the improvements on, the relaxed
ones), and for each match — read back as Inductor's :class:`~._match.Match` from the
bindings fxpass's matcher returns — Inductor's checks (one mutation region, one stream,
``extra_check``) and the edit: the recorded replacement replayed (:class:`~fxpass.rewrite.
Replace`), or the entry's handler, which edits the graph itself (:class:`~fxpass.rewrite.
Surgery`). At the end it reports the statistics and near misses to the run (the context
``apply`` was handed, else the run in progress).
"""

from __future__ import annotations

import os
import time
from bisect import bisect_right
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
from torch import fx
from torch.fx import Node
from torch.fx.experimental.symbolic_shapes import guard_or_false

from ...core.context import PassContext, current_context
from ...fxutil.fx_internals import sort_key
from ...rewrite import Choice, Guide, Replace, Rewriter, Surgery
from ...rewrite.match import MatchState
from ._compile import compile_pattern
from ._entry import (
    RELAXED,
    STRICT,
    GraphPatternEntry,
    PatternEntry,
    debug_node,
    explain_failure,
    log,
)
from ._explain import miss_hints
from ._match import read_back
from ._matching import dependent_values
from ._regions import is_mutation_op, unsupported_node

__all__ = ["ApplyStats", "PassRun"]


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


_BACKEND = os.environ.get("TORCHINDUCTOR_PATTERN_MATCH_BACKEND", "inductor")
_WALK = 256
_AF = torch.ops.higher_order.auto_functionalized
_AF_V2 = (
    torch.ops.higher_order.auto_functionalized_v2
)  # a match spanning more nodes is checked against the list of mutating ops


class PassRun:
    """One ``apply`` of ``owner`` (a ``PatternMatcherPass``): the :class:`~fxpass.rewrite.
    Guide` it declares (:meth:`guide`), the hook of each entry's choice (:meth:`decide`),
    the statistics (``stats``) and the report (:meth:`finish`). It is what a match's ``run``
    is: the ``rewriter`` applying it, the ``entry_name`` being applied, a ``state`` for
    matching more patterns at its nodes."""

    def __init__(self, owner: Any, ctx: PassContext | None = None) -> None:
        self.owner = owner
        self.ctx = ctx
        self.patterns = owner.patterns
        self.improve = owner._improving()
        self.name = owner.pass_name if owner.pass_name is not None else "pattern_matcher"
        self.entry_name = self.name
        self.stats = ApplyStats()
        self.rewriter: Rewriter | None = None
        self._state: MatchState | None = None
        self._mutations: list[Any] | None = None
        self._choices: dict[int, tuple[PatternEntry, Choice]] = {}
        from torch._dynamo.utils import counters
        from torch._inductor import config

        self.counters = counters
        self.cpp = config.disable_cpp_codegen
        self._skips: dict[Node, bool] = {}
        self.debug = os.environ.get("TORCHINDUCTOR_PATTERN_MATCH_DEBUG") or None
        self._t0 = time.perf_counter()

    def guide(self) -> Guide:
        """Inductor's walk: the nodes calling a registered op (a module: any), from the last
        to the first, each trying that op's entries in registration order; with the
        improvements, the nodes functionalization v2 makes as v1's."""
        return Guide(
            _Table(self),
            reverse=True,
            aliases={_AF_V2: _AF} if self.improve else {},
            finish=self.finish,
        )

    @property
    def state(self) -> MatchState:
        """A match state for matching more patterns in the graph being rewritten."""
        if self._state is None:
            self._state = MatchState(order=self.rewriter.order)
        return self._state

    def choice(self, entry: PatternEntry) -> Choice:
        """``entry`` as rewrite's choice: Inductor's rules for its pattern, then (improving)
        the relaxed ones, and :meth:`decide`; a pattern that can never match (Inductor's
        "no anchor") tries nothing."""
        hit = self._choices.get(id(entry))
        if hit is not None and hit[0] is entry:
            return hit[1]
        compiled = compile_pattern(entry.pattern)
        if compiled.unanchored is not None:
            hit = Choice((), partial(self.decide, entry, ()))
        elif self.improve:
            relaxed = compile_pattern(entry.pattern, relaxed=True)
            hit = Choice(
                ((compiled.rule, STRICT), (relaxed.rule, RELAXED)),
                partial(self.decide, entry, (compiled, relaxed)),
            )
        else:
            hit = Choice(((compiled.rule, STRICT),), partial(self.decide, entry, (compiled,)))
        self._choices[id(entry)] = (entry, hit)
        return hit

    def decide(
        self,
        entry: PatternEntry,
        compiled: tuple[Any, ...],
        node: Node,
        found: Any,
        tier: int,
        rewriter: Rewriter,
    ) -> Replace | Surgery | None:
        """The hook of ``entry``'s choice: Inductor's checks of its match at ``node`` (read
        back from ``found``, the match of ``compiled[tier]``); the edit that applies it."""
        self.rewriter = rewriter
        name = entry.entry_name
        self.entry_name = name
        tally = self.stats.by_entry.setdefault(name, [0, 0])
        tally[0] += 1
        debug = self.debug is not None and debug_node(node.name, self.debug)
        if debug and self.skip(node):
            return None
        m = read_back(compiled[tier], found, extra=tier > 0) if found is not None else None
        if debug:
            shown = m if m is not None else explain_failure(entry.pattern, node, self.improve)
            log.warning("%s%s %s %s", node, node.args, shown, entry.pattern)
        if m is None or self.skip(node):
            return None
        if not self.one_region(m.nodes) or not _one_stream(m.nodes):
            return None
        m.run = self
        if (
            isinstance(entry, GraphPatternEntry)
            and m.found is not None
            and not m.extra
            and dependent_values(m.found)
        ):  # a bound value computed from the match's nodes: what the handler reads is unknown
            return None
        if not _truthy(entry.extra_check(m)):
            return None
        if not rewriter.editor.allow():
            return None
        self.stats.matches += 1
        self.stats.extra += int(m.extra)
        tally[1] += 1
        c = self.counters[_BACKEND]
        c["pattern_matcher_count"] += 1
        c["pattern_matcher_nodes"] += len(m.nodes)
        return entry.edit(m, node.graph, node)

    def finish(self, graph: fx.Graph) -> None:
        """After the walk: the statistics, on the pass and to the run in progress."""
        self.stats.seconds = time.perf_counter() - self._t0
        self.owner.stats = self.stats
        self.report(graph)

    # ----- Inductor's checks --------------------------------------------------------------
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
        keys = self._mutation_keys(lo.graph)
        return bisect_right(keys, sort_key(hi)) == bisect_right(keys, sort_key(lo))

    def _mutation_keys(self, graph: fx.Graph) -> list[Any]:
        if self._mutations is None:
            self._mutations = [sort_key(n) for n in graph.nodes if is_mutation_op(n)]
        return self._mutations

    def replaced(self, old: list[Node], new: list[Node]) -> None:
        """After an edit: mutation regions move if it added or removed a mutating op."""
        if (self._mutations and any(is_mutation_op(n) for n in old)) or any(
            is_mutation_op(n) for n in new
        ):
            self._mutations = None

    # ----- the report ----------------------------------------------------------------------
    def report(self, graph: fx.Graph) -> None:
        ctx = self.ctx if self.ctx is not None else current_context()
        if ctx is None:
            return
        ctx.stat("matches", self.stats.matches)
        ctx.stat("extra_sites", self.stats.extra)
        for name, (tried, matched) in self.stats.by_entry.items():
            ctx.stat(f"{name}.tried", tried)
            ctx.stat(f"{name}.matched", matched)
        record = ctx.record
        if record is not None:
            record.hints.extend(miss_hints(self.patterns, graph, self.stats, self.improve))


class _Table(Mapping):
    """The pass's entries as rewrite's choices, keyed as the pass files them; each entry's
    choice is made the first time a node asks for it."""

    def __init__(self, run: PassRun) -> None:
        self.run = run
        self.patterns = run.patterns
        self._made: dict[int, tuple[list[PatternEntry], int, tuple[Choice, ...]]] = {}

    def __getitem__(self, key: tuple[str, Any]) -> tuple[Choice, ...]:
        entries = self.patterns.get(key)
        if entries is None:
            raise KeyError(key)
        hit = self._made.get(id(entries))
        if hit is None or hit[0] is not entries or hit[1] != len(entries):  # one registered since
            hit = self._made[id(entries)] = (
                entries,
                len(entries),
                tuple(map(self.run.choice, entries)),
            )
        return hit[2]

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        return iter(self.patterns)

    def __len__(self) -> int:
        return len(self.patterns)


def _one_stream(nodes: list[Node]) -> bool:
    streams = {n.meta.get("custom", {}).get("stream", 0) for n in nodes}
    return len(streams) <= 1


def _truthy(value: Any) -> bool:
    return bool(guard_or_false(value))
