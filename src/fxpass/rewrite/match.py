"""Matches, and the op-indexed matcher that finds them.

The matcher files every rule under the ops its root pattern can match, so a node only tries
the rules that can match it: a graph of 16,000 nodes with one fusion rule tries that rule at
the few hundred nodes that call its root op, not everywhere.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import fx
from torch.fx import Node

from ..fxutil.dialect import aten_op, spellings
from ._state import MatchState
from .pattern import _OpOverload, _OpOverloadPacket
from .rule import _DROPPED, _NODES, _OUTS, _SOFT, Rule

__all__ = ["Match", "Matcher", "RuleStats"]


@dataclass
class Match:
    """Where a rule matched: the root node, the names bound, and the nodes the match covers.

    ``outputs`` are the nodes whose uses the replacement takes over (the roots, then the
    rule's named outputs); ``nodes`` every node matched by an op pattern; ``dropped`` the
    assertion nodes hanging off inner nodes that go away with them; ``chains`` the runs of
    views and no-op casts that :meth:`P.through <fxpass.rewrite.P.through>` patterns saw
    through (innermost node first), and ``seen_through`` those of their nodes that stay in
    the graph (erased once nothing uses them).
    """

    rule: Rule
    root: Node
    bindings: dict[str, Any]
    nodes: list[Node]
    outputs: list[Node]
    dropped: list[Node] = field(default_factory=list)
    inputs: list[Node] = field(default_factory=list)  # filled in by the fixpoint driver
    chains: list[tuple[Node, ...]] = field(default_factory=list)
    seen_through: list[Node] = field(default_factory=list)

    def __getitem__(self, name: str) -> Any:
        try:
            return self.bindings[name]
        except KeyError:
            raise KeyError(
                f"the match of rule '{self.rule.name}' binds no '{name}'; "
                f"it binds {sorted(self.bindings)}"
            ) from None

    @property
    def graph(self) -> fx.Graph:
        return self.root.graph

    def __repr__(self) -> str:
        binds = ", ".join(
            f"{k}=%{v.name}" if isinstance(v, Node) else f"{k}={v!r}"
            for k, v in self.bindings.items()
        )
        return f"Match({self.rule.name} at %{self.root.name}: {binds})"


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


class Matcher:
    """Rules indexed by root op; :meth:`match` returns the first rule's match at a node."""

    def __init__(self, rules: Sequence[Rule]) -> None:
        self.rules = list(rules)
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
        self._has_packets = any(isinstance(t, _OpOverloadPacket) for t in self._targets.values())
        self._cache: dict[Any, tuple[Any, tuple[Rule, ...]]] = {}
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

    def rules_for(self, node: Node) -> tuple[Rule, ...]:
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
            if isinstance(base, _OpOverload):
                idx |= set(self._by_key.get(id(base.overloadpacket), ()))
        rules = tuple(self.rules[i] for i in sorted(idx))
        self._cache[key] = (target, rules)
        return rules

    def match(self, node: Node, *, order: Any = None, st: MatchState | None = None) -> Match | None:
        """The match of the first rule (in priority order) that matches at ``node``."""
        rules = self.rules_for(node)
        if not rules:
            return None
        for match, _ in self._matches(rules, node, st or MatchState(order=order)):
            return match
        return None

    def _matches(self, rules: Sequence[Rule], node: Node, st: MatchState):
        """(match, the rule's stats) for each of ``rules`` that matches at ``node``, in
        order; every rule tried is timed and counted. The driver takes the first match it
        can apply."""
        stats = self.stats
        perf = time.perf_counter
        for rule in rules:
            s = stats[rule.name]
            t0 = perf()
            ok = rule._try(node, st)
            s.seconds += perf() - t0
            s.tried += 1
            if ok:
                s.matched += 1
                yield _make_match(rule, node, st), s

    def match_rule(self, rule: Rule, node: Node, *, order: Any = None) -> Match | None:
        """The match of ``rule`` at ``node`` (index not consulted), or None."""
        st = MatchState(order=order if order is not None else _lazy_order(node.graph))
        if rule._try(node, st):
            return _make_match(rule, node, st)
        return None


def _make_match(rule: Rule, node: Node, st: MatchState) -> Match:
    return Match(
        rule=rule,
        root=node,
        bindings=dict(st.env),
        nodes=list(st.memo[_NODES]),
        outputs=list(st.memo[_OUTS]),
        dropped=list(st.memo[_DROPPED]),
        chains=list(st.chains),
        seen_through=list(st.memo[_SOFT]),
    )


def _lazy_order(graph: fx.Graph) -> Callable[[], Any]:
    from .order import TopoOrder

    box: list[Any] = []

    def get() -> Any:
        if not box:
            box.append(TopoOrder(graph))
        return box[0]

    return get
