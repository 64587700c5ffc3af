"""Explain a miss: why a rule did not match at a node, or anywhere in a graph.

>>> from fxpass.rewrite import explain
>>> print(explain(rule, node))      # the first constraint that failed at this node
>>> print(explain(rule, gm))        # where it matched, and its closest miss
>>> print(explain(rule_set, gm))    # the same for every rule of a set

The matcher replays the search with explanations on and keeps the failure that came
deepest into the pattern (the most nodes matched): wrong op, extra user, literal differs,
dtype/rank/shape, a name bound twice to different values, a predicate, a would-be cycle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import fx
from torch.fx import Node

from ..edit.location import short
from ..fxutil.dialect import aten_op
from ..fxutil.views import view_base_name
from ._state import MatchState
from .match import _lazy_order
from .pattern import CAST_OPS, AnyOf, P, Pattern, node_key, op_name
from .rule import Rule, RuleSet, as_rule

__all__ = ["Explanation", "GraphExplanation", "explain", "near_misses"]


@dataclass
class Explanation:
    """Whether ``rule`` matches at ``node``, and if not, the first failing constraint."""

    rule: Rule
    node: Node
    matched: bool
    reason: str = ""
    at: Node | None = None
    depth: int = 0

    def __bool__(self) -> bool:
        return self.matched

    def __str__(self) -> str:
        head = f"rule '{self.rule.name}' ({short(self.rule.location)}) at %{self.node.name}"
        if self.matched:
            return f"{head}: matches"
        where = f" [at %{self.at.name}]" if self.at is not None and self.at is not self.node else ""
        return f"{head}: no match: {self.reason}{where}"


@dataclass
class GraphExplanation:
    """Where ``rule`` matches in a graph and, if nowhere, its closest miss."""

    rule: Rule
    candidates: int
    matches: list[Node] = field(default_factory=list)
    closest: Explanation | None = None
    reasons: dict[str, int] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.matches)

    def __str__(self) -> str:
        head = f"rule '{self.rule.name}' ({short(self.rule.location)})"
        if not self.candidates:
            return f"{head}: no node calls its root op ({_root_ops(self.rule)})"
        lines = [
            f"{head}: matches at {len(self.matches)} of {self.candidates} candidate nodes"
            + (": " + ", ".join(f"%{n.name}" for n in self.matches[:8]) if self.matches else "")
            + (" ..." if len(self.matches) > 8 else "")
        ]
        if self.closest is not None:
            lines.append(f"  closest miss: {self.closest}")
        for reason, n in sorted(self.reasons.items(), key=lambda kv: -kv[1])[:5]:
            lines.append(f"  {n:>5} x {reason}")
        return "\n".join(lines)


@dataclass
class Explanations:
    """One explanation per rule of a rule set."""

    items: list[Any]

    def __iter__(self):
        return iter(self.items)

    def __getitem__(self, i: int) -> Any:
        return self.items[i]

    def __len__(self) -> int:
        return len(self.items)

    def __str__(self) -> str:
        return "\n".join(str(i) for i in self.items)


def _root_ops(rule: Rule) -> str:
    keys = rule.index_keys()
    if keys is None:
        return "any"
    names = []
    for k in keys:
        if isinstance(k, tuple):
            names.append(f".{k[1]}()" if k[0] == "method" else f"module {k[1]}")
        else:
            names.append(op_name(k))
    return ", ".join(sorted(names))


def _may_root(keys: frozenset, node: Node) -> bool:
    """Can a rule filed under ``keys`` be rooted at ``node`` (its op, in any spelling)?"""
    key = node_key(node)
    if key in keys or getattr(key, "overloadpacket", None) in keys:
        return True
    base = aten_op(key)
    return base is not key and (base in keys or getattr(base, "overloadpacket", None) in keys)


def explain_at(rule: Rule, node: Node, order: Any = None) -> Explanation:
    """Why ``rule`` does (not) match at ``node``."""
    keys = rule.index_keys()
    if keys is not None and not _may_root(keys, node):
        have = op_name(node.target) if node.op == "call_function" else f"a {node.op} node"
        return Explanation(
            rule,
            node,
            False,
            f"wrong op at the root: the rule starts at {_root_ops(rule)}, %{node.name} is {have}",
            node,
        )
    st = MatchState(explain=True, order=order if order is not None else _lazy_order(node.graph))
    if rule._try(node, st):
        return Explanation(rule, node, True)
    return Explanation(rule, node, False, st.why or "no match", st.why_node, st.why_depth)


def _explain_graph(rule: Rule, graph: fx.Graph) -> GraphExplanation:
    keys = rule.index_keys()
    order = _lazy_order(graph)
    out = GraphExplanation(rule, 0)
    for node in graph.nodes:
        if keys is not None and not _may_root(keys, node):
            continue
        out.candidates += 1
        e = explain_at(rule, node, order)
        if e.matched:
            out.matches.append(node)
            continue
        reason = e.reason.split(":", 1)[0] if ":" in e.reason else e.reason
        out.reasons[reason] = out.reasons.get(reason, 0) + 1
        if out.closest is None or e.depth > out.closest.depth:
            out.closest = e
    return out


def min_ops(p: Pattern) -> int:
    """The fewest op nodes a complete match of ``p`` covers (alternatives: the shortest)."""
    memo: dict[int, int] = {}

    def walk(q: Pattern) -> int:
        key = id(q)
        if key not in memo:
            memo[key] = 0  # a DAG revisits shared patterns: count them once
            if isinstance(q, AnyOf):
                memo[key] = min((walk(o) for o in q.options), default=0)
            else:
                own = 1 if isinstance(q, P) else 0
                memo[key] = own + sum(walk(c) for c in q.children())
        return memo[key]

    return walk(p)


def near_misses(rule: Rule, graph: fx.Graph, *, limit: int = 64) -> list[Explanation]:
    """The candidate nodes (those calling the rule's root op) where ``rule`` came close:
    matching got through half of the pattern's ops (the root at least) and then failed
    on a check — an extra user, a literal, a dtype or shape, a name bound twice, ``where``,
    a cycle — or on views or casts in front of an op the rule names (which
    :meth:`P.through` sees past), not on a graph that simply computes something else. Replays at most ``limit`` unmatched
    candidates; the deepest misses come first."""
    keys = rule.index_keys()
    need = max(1, min_ops(rule.roots[0]) // 2)
    order = _lazy_order(graph)
    out: list[Explanation] = []
    replayed = 0
    for node in graph.nodes:
        if replayed >= limit:
            break
        if keys is not None and not _may_root(keys, node):
            continue
        replayed += 1
        e = explain_at(rule, node, order)
        if not e.matched and e.depth >= need and _close(e, rule):
            out.append(e)
    out.sort(key=lambda e: -e.depth)
    return out


def _close(e: Explanation, rule: Rule) -> bool:
    """A miss on a check, or on views and casts in front of an op the rule names."""
    if not e.reason.startswith("wrong op"):
        return True
    node = e.at
    hops = 0
    while _in_the_way(node) and hops < 16:
        node, hops = node.args[0], hops + 1
    if not hops or not isinstance(node, Node) or node.op != "call_function":
        return False
    names = {id(t) for p in rule.roots for q in p.walk() if isinstance(q, P) for t in q.fns}
    return id(node.target) in names or id(aten_op(node.target)) in names


def _in_the_way(node: Any) -> bool:
    """A view or cast: what P.through sees past."""
    if not isinstance(node, Node) or node.op not in ("call_function", "call_method"):
        return False
    if not node.args or not isinstance(node.args[0], Node):
        return False
    if view_base_name(node) is not None:
        return True
    return node.target in CAST_OPS or aten_op(node.target) in CAST_OPS


def explain(rules: Any, target: Any) -> Any:
    """Explain ``rules`` (a rule, a rule set or a list) at a node or over a graph."""
    if isinstance(target, fx.GraphModule):
        target = target.graph
    if isinstance(rules, RuleSet):
        return Explanations([explain(r, target) for r in rules])
    if isinstance(rules, (list, tuple)) and not isinstance(rules, Rule):
        items = [as_rule(r) for r in rules] if not _is_rule_tuple(rules) else [as_rule(rules)]
        return Explanations([explain(r, target) for r in items])
    rule = as_rule(rules)
    if isinstance(target, Node):
        return explain_at(rule, target)
    if isinstance(target, fx.Graph):
        return _explain_graph(rule, target)
    raise TypeError(
        f"explain() needs a Node, a Graph or a GraphModule, not {type(target).__name__}"
    )


def _is_rule_tuple(x: Any) -> bool:
    return (
        isinstance(x, tuple) and len(x) in (2, 3) and callable(x[1]) and not isinstance(x[1], Rule)
    )
