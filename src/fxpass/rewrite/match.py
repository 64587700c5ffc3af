"""The op-indexed matcher: one interface in front of the interpreted and compiled matchers.

The matcher files every rule under the ops its root pattern can match, so a node only tries
the rules that can match it: a graph of 16,000 nodes with one fusion rule tries that rule at
the few hundred nodes that call its root op, not everywhere. At each node a rule is tried by
its compiled matcher (:mod:`~fxpass.rewrite.compile`) where it has one and the policy
allows, else by the interpreter (:mod:`~fxpass.rewrite.interpreted`) — or a subclass of it
that explains misses or follows torch's rules. Either way the result is a
:class:`~fxpass.rewrite.Match`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from torch.fx import Node

from ..fxutil.dialect import aten_op, spellings
from ._state import MISSING, MatchState
from .compile import CompiledMatcher, compile_rule
from .interpreted import Interpreter
from .learned import learned
from .reach import Reach
from .region import Match, MatchedRule, lazy_order
from .specialize import specialize_rule
from .spelling import OpOverload, OpOverloadPacket

#: ``MatchState`` (a match in progress) and ``MISSING`` are part of the interface: a matcher
#: policy outside this package (``compat/inductor``) drives matches with them.
__all__ = ["MISSING", "MatchState", "Matcher", "RuleStats", "attempt", "match_at"]

_PLAIN = Interpreter()


@dataclass
class RuleStats:
    """How one rule fared in a run: nodes tried, matches found and made, time spent."""

    tried: int = 0
    matched: int = 0
    rewritten: int = 0
    declined: int = 0
    skipped: int = 0
    seconds: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return {
            "tried": self.tried,
            "matched": self.matched,
            "rewritten": self.rewritten,
            "declined": self.declined,
            "skipped": self.skipped,
            "ms": round(self.seconds * 1000, 3),
        }


def compiled(rule: MatchedRule) -> CompiledMatcher | None:
    """The rule's compiled matcher, made on first use: straight-line code where the rule
    has no alternatives, else the interpreter's handlers specialized to its pattern nodes
    behind the paths its matches teach (:mod:`~fxpass.rewrite.learned`); None: it needs the
    interpreter itself."""
    c = rule._compiled
    if c is MISSING:
        c = compile_rule(rule)
        if c is None:
            fn = specialize_rule(rule)
            if fn is not None:
                c = CompiledMatcher(learned(rule, fn), "# learned paths, then specialized closures")
        rule._compiled = c
    return c


def attempt(rule: MatchedRule, node: Node, st: MatchState, interp: Interpreter = _PLAIN) -> bool:
    """Try ``rule`` rooted at ``node``; on success ``st.found`` holds the match."""
    st.reset()
    st.roots = [node]
    if interp.compiled:
        c = rule._compiled
        if c is MISSING:
            c = compiled(rule)
        if c is not None:
            return c.fn(node, st, interp.final)
    return interp.match_rule(rule, node, st)


def match_at(
    rule: MatchedRule, node: Node, *, order: Any = None, interp: Interpreter = _PLAIN
) -> Match | None:
    """The match of ``rule`` at ``node`` (no index consulted), or None."""
    st = MatchState(order=order if order is not None else lazy_order(node.graph))
    return st.found if attempt(rule, node, st, interp) else None


class Matcher:
    """Rules indexed by root op; :meth:`match` returns the first rule's match at a node.

    ``interp``: how to match (default: plainly, compiled where possible); e.g.
    :class:`~fxpass.rewrite.torchlike.TorchMatching` for torch's rules."""

    def __init__(self, rules: Sequence[MatchedRule], interp: Interpreter | None = None) -> None:
        self.rules = list(rules)
        self.interp = interp or _PLAIN
        # call_function targets are filed by id(): OpOverload.__hash__ is Python code.
        self._by_key: dict[Any, list[int]] = {}
        self._targets: dict[int, Any] = {}  # id -> target (keeps ids valid)
        self._wild: list[int] = []
        for i, r in enumerate(self.rules):
            keys = r.index_keys()
            if keys is None:
                self._wild.append(i)
                continue
            for key in keys:
                if not isinstance(key, tuple):
                    self._targets[id(key)] = key
                    key = id(key)
                self._by_key.setdefault(key, []).append(i)
        self._has_packets = any(isinstance(t, OpOverloadPacket) for t in self._targets.values())
        self._cache: dict[Any, tuple[Any, tuple[MatchedRule, ...]]] = {}
        self.stats: dict[str, RuleStats] = {r.name: RuleStats() for r in self.rules}

    def wanted(self) -> set | None:
        """Keys of every op some rule is rooted at (ids for functions, their Edge spellings
        included); None: any node."""
        if self._wild or self._has_packets:
            return None
        keys = set(self._by_key)
        for target in self.root_targets():
            keys.update(id(s) for s in spellings(target))
        return keys

    def root_targets(self) -> list[Any]:
        """The functions some rule is rooted at (not their other spellings)."""
        return [self._targets[k] for k in self._by_key if not isinstance(k, tuple)]

    def reset_stats(self) -> None:
        for s in self.stats.values():
            s.__init__()

    def rules_for(self, node: Node) -> tuple[MatchedRule, ...]:
        """The rules that may match at ``node`` (by its op), in priority order."""
        op = node.op
        target = node.target
        if op == "call_function":
            key: Any = id(target)
        elif op == "call_method" or op == "call_module":
            key = (op[5:], target)
        else:
            key = (op,)
        hit = self._cache.get(key)
        if hit is not None and hit[0] is target:
            return hit[1]
        idx = set(self._wild) | set(self._by_key.get(key, ()))
        if op == "call_function":
            base = aten_op(target)  # rules written for ATen match its Edge spellings
            if base is not target:
                idx |= set(self._by_key.get(id(base), ()))
            if isinstance(base, OpOverload):
                idx |= set(self._by_key.get(id(base.overloadpacket), ()))
        rules = tuple(self.rules[i] for i in sorted(idx))
        self._cache[key] = (target, rules)
        return rules

    def match(self, node: Node, *, order: Any = None, st: MatchState | None = None) -> Match | None:
        """The match of the first rule (in priority order) that matches at ``node``."""
        rules = self.rules_for(node)
        if not rules:
            return None
        for match, _ in self.matches(rules, node, st or MatchState(order=order)):
            return match
        return None

    def matches(
        self, rules: Sequence[MatchedRule], node: Node, st: MatchState, reach: Reach | None = None
    ) -> Iterator[tuple[Match, RuleStats]]:
        """(match, the rule's stats) for each of ``rules`` that matches at ``node``, in
        order; every rule tried is timed and counted. The driver takes the first match it
        can apply. A rule ``reach`` rules out at ``node`` counts as tried (and failed)."""
        stats = self.stats
        perf = time.perf_counter
        interp = self.interp
        for rule in rules:
            s = stats[rule.name]
            if reach is not None and not reach.may_match(rule, node):
                s.tried += 1
                continue
            t0 = perf()
            ok = attempt(rule, node, st, interp)
            s.seconds += perf() - t0
            s.tried += 1
            if ok:
                s.matched += 1
                yield st.found, s
