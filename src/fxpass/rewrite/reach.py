"""Where a rule can match at all: at the right distance from an op every match contains.

A pattern names ops that any match must contain: RMSNorm spelled any way has an ``rsqrt``
(or a ``sqrt``) two to four ops below its root. :func:`requirement` finds such a set of ops
for a pattern, choosing the ops rarest in the graph at hand; a :class:`Reach` then finds
the nodes calling them (torch's op index) and, following their uses, the nodes at each
distance from them. A rule is tried at a node only where the distances its pattern allows
for a root calling that node's op (alternatives the graph cannot match left out: their ops
appear nowhere in it) include one at which the node lies. Any other node cannot be the root
of a match, so every rewrite is found as before, at a fraction of the attempts: on a
128-layer decoder the library's add + RMSNorm fusion is tried at about 260 of its 2,564
candidate roots.

A rewrite creates edges, so it may bring such an op closer to a node (or create one). After
each rewrite the driver hands :meth:`Reach.touched` the new nodes and the values that took
over uses: every path a rewrite shortens or creates runs through one of them, so where
such an op lies upstream of them, whatever lies downstream within the distance may be
tried from then on.

Only the plain matcher's semantics are assumed (a matcher that lets a node stand for any op,
as torch's ``name_match`` does, gets no reach).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from torch import fx
from torch.fx import Node

from ..fxutil.dialect import spellings
from ..fxutil.fx import input_nodes
from .leaves import AnyOf, Pattern, Seq, Through
from .pattern import P

__all__ = ["Reach", "requirement"]

Requirement = tuple[frozenset, int]  # (op keys, distance)


def _own_keys(p: P) -> frozenset | None:
    """The ops a node matching ``p`` calls, as lookup keys; None where they cannot be
    looked up (an op packet stands for overloads the index does not group)."""
    if p.packets:
        return None
    return frozenset(
        [*p.fns, *(("method", m) for m in p.methods), *(("module", m) for m in p.modules)]
    )


def _nodes_calling(graph: fx.Graph, key: Any) -> list[Node]:
    if isinstance(key, tuple):
        kind, name = key
        return [n for n in graph.find_nodes(op=f"call_{kind}") if n.target == name]
    found = list(graph.find_nodes(op="call_function", target=key, sort=False))
    for other in spellings(key):  # Edge graphs call the Edge spellings
        found.extend(graph.find_nodes(op="call_function", target=other, sort=False))
    return found


def _counts(pattern: Pattern, graph: fx.Graph) -> dict[Any, int]:
    """How many nodes of ``graph`` call each op of ``pattern``."""
    counts: dict[Any, int] = {}
    for p in pattern.walk():
        if p.__class__ is P:
            for key in _own_keys(p) or ():
                if key not in counts:
                    counts[key] = len(_nodes_calling(graph, key))
    return counts


def _distance(p: Pattern, ops: frozenset, memo: dict[int, float]) -> float:
    """How far below a match of ``p`` a node calling one of ``ops`` is at most (inf: not
    every match has one)."""
    key = id(p)
    hit = memo.get(key)
    if hit is not None:
        return hit
    memo[key] = _INF  # a pattern is a DAG, but guard against cycles all the same
    cls = p.__class__
    out = _INF
    if cls is P:
        own = _own_keys(p)
        if own is not None and own <= ops:
            out = 0
        else:
            for child in p.children():
                out = min(out, _distance(child, ops, memo) + 1)
    elif cls is AnyOf:  # every option must have one: the farthest counts
        out = max((_distance(o, ops, memo) for o in p.options), default=_INF)
    elif cls is Through:  # the inner pattern sits at most MAX_CHAIN views further down
        out = _distance(p.inner, ops, memo) + p.MAX_CHAIN
    elif cls is Seq:
        out = min((_distance(item, ops, memo) for item in p.items), default=_INF)
    memo[key] = out
    return out


_INF = float("inf")


def requirement(
    pattern: Pattern, graph: fx.Graph, counts: dict[Any, int] | None = None
) -> Requirement | None:
    """``(ops, d)``: every match of ``pattern`` contains a node calling one of ``ops`` at
    most ``d`` inputs below the match's root, the ops chosen so that few nodes of ``graph``
    call them; None when the pattern promises no op (its root may be anything).

    The candidates are the pattern's own ops, rarest first (ops the graph never calls come
    free); the first ``k`` of them for every ``k``, scored by the nodes calling them times
    the distance."""
    if counts is None:
        counts = _counts(pattern, graph)
    ranked = sorted(counts, key=counts.__getitem__)
    best: Requirement | None = None
    best_cost = _INF
    chosen: set = set()
    total = 0
    for key in ranked:
        chosen.add(key)
        total += counts[key]
        if total >= best_cost:
            break
        if counts[key] == 0 and len(chosen) < len(ranked) and counts[ranked[len(chosen)]] == 0:
            continue  # take every op the graph never calls before scoring
        ops = frozenset(chosen)
        depth = _distance(pattern, ops, {})
        if depth == _INF:
            continue
        cost = total * (depth + 1)
        if cost < best_cost:
            best, best_cost = (ops, int(depth)), cost
    return best


_ALWAYS = None  # a distance set that constrains nothing


class _Guarantees:
    """At which distances below a match of a pattern a node calling one of ``ops`` lies, in
    the graph as it is: a bit mask (bit ``d``: distance ``d``); 0 where the pattern cannot
    match at all (it needs an op the graph never calls), None where some match may have
    no such node."""

    def __init__(self, ops: frozenset, counts: dict[Any, int]) -> None:
        self.ops = ops
        self.counts = counts
        self.memo: dict[int, int | None] = {}

    def of(self, p: Pattern) -> int | None:
        key = id(p)
        if key in self.memo:
            return self.memo[key]
        self.memo[key] = _ALWAYS  # a pattern is a DAG, but guard against cycles all the same
        out = self._compute(p)
        self.memo[key] = out
        return out

    def _compute(self, p: Pattern) -> int | None:
        cls = p.__class__
        if cls is P:
            own = _own_keys(p)
            if own is not None and not any(self.counts.get(k, 1) for k in own):
                return 0  # no node of the graph calls its ops
            best = self._mandatory(p.children())
            if best == 0 or (own is not None and own <= self.ops):
                return 0 if best == 0 else 1
            return _ALWAYS if best is _ALWAYS else best << 1
        if cls is AnyOf:
            mask = 0
            for option in p.options:
                sub = self.of(option)
                if sub is _ALWAYS:
                    return _ALWAYS
                mask |= sub
            return mask
        if cls is Through:  # the inner pattern sits up to MAX_CHAIN views further down
            sub = self.of(p.inner)
            if not sub:
                return sub
            return sum(sub << j for j in range(p.MAX_CHAIN + 1))
        if cls is Seq:
            return self._mandatory(p.items)
        return _ALWAYS  # a leaf (or a pattern kind of another matcher): anything

    def _mandatory(self, parts: Iterable[Pattern]) -> int | None:
        """Of patterns that must all match: 0 if one cannot; else the nearest guarantee."""
        best = _ALWAYS
        for part in parts:
            sub = self.of(part)
            if sub == 0:
                return 0
            if sub is not _ALWAYS and (best is _ALWAYS or sub.bit_length() < best.bit_length()):
                best = sub
        return best


def _alternatives(p: Pattern) -> Iterable[Pattern]:
    """The root's alternatives (nested ``any_of`` flattened)."""
    if p.__class__ is AnyOf:
        for option in p.options:
            yield from _alternatives(option)
    else:
        yield p


class _RuleReach:
    """One rule's reach in one graph."""

    def __init__(self, rule: Any, graph: fx.Graph, req: Requirement, counts: dict) -> None:
        self.rule = rule  # keeps its id valid
        ops, self.depth = req
        self.ids, self.names = _lookup(ops)
        # ops of the pattern no node calls yet: the guarantees leave out what needs them
        self.absent = _lookup([k for k, n in counts.items() if n == 0])
        self.anywhere = False  # a rewrite made one of them: from then on, try everywhere
        self.guarantees = _Guarantees(ops, counts)
        self.alternatives = list(_alternatives(rule.roots[0]))
        self.by_target: dict[int, tuple[Any, str, int | None]] = {}
        self.always: set[Node] = set()  # reached by the new edges of rewrites
        seeds = [n for k in ops for n in _nodes_calling(graph, k)]
        self.levels = _levels(seeds, self.depth)

    def calls(self, n: Node) -> bool:
        """Whether ``n`` calls one of the requirement's ops."""
        return _calls(n, self.ids, self.names)

    def allowed(self, node: Node) -> int | None:
        """The distances a match rooted at ``node`` (by its op) allows."""
        target = node.target
        hit = self.by_target.get(id(target))
        if hit is None or hit[0] is not target or hit[1] != node.op:
            mask: int | None = 0
            for alt in self.alternatives:
                if alt.__class__ is P and not alt.accepts(node):
                    continue
                sub = self.guarantees.of(alt)
                if sub is _ALWAYS:
                    mask = _ALWAYS
                    break
                mask |= sub
            hit = self.by_target[id(target)] = (target, node.op, mask)
        return hit[2]

    def may_match(self, node: Node) -> bool:
        """False only when no match of the rule can be rooted at ``node``."""
        level = self.levels.get(node)
        if level is None:  # no such op within the distance: only an unconstrained root
            if self.anywhere or node in self.always:
                return True
            return self.allowed(node) is _ALWAYS
        mask = self.allowed(node)
        return mask is _ALWAYS or bool(level & mask) or self.anywhere or node in self.always

    def touched(self, created: Sequence[Node], rewired: Sequence[Node]) -> None:
        if any(_calls(n, *self.absent) for n in created):
            self.anywhere = True
            return
        # A new path from such an op runs through an edge from a node the rewrite reads
        # (or a value that took over uses) into a new node (or a user of that value). It
        # matters only if the op lies within the distance upstream of that node: then the
        # node is marked already — at a distance from the graph's ops, or downstream of an
        # earlier rewrite that passed this test.
        new = set(created)
        levels, always = self.levels, self.always
        frontier = [a for n in created for a in input_nodes(n) if a not in new]
        frontier.extend(v for v in rewired if v not in new)
        if any(a in levels or a in always for a in frontier) or any(map(self.calls, created)):
            _downstream([*created, *rewired], self.depth, self.always)


def _lookup(keys: Iterable[Any]) -> tuple[set[int], set[tuple]]:
    """Ids of the functions among ``keys`` (and of their Edge spellings), and the
    ``(kind, name)`` keys of methods and modules."""
    ids: set[int] = set()
    names: set[tuple] = set()
    for k in keys:
        if isinstance(k, tuple):
            names.add(k)
        else:
            ids.add(id(k))
            ids.update(id(s) for s in spellings(k))
    return ids, names


def _calls(n: Node, ids: set[int], names: set[tuple]) -> bool:
    op = n.op
    if op == "call_function":
        return id(n.target) in ids
    return (op[5:], n.target) in names


class Reach:
    """Per rule, the nodes it may be rooted at in one graph (see the module docstring);
    computed for a rule when first asked about it."""

    def __init__(self, graph: fx.Graph) -> None:
        self.graph = graph
        self._rules: dict[int, _RuleReach | None] = {}  # None: the rule may match anywhere
        self._keep: list[Any] = []

    def may_match(self, rule: Any, node: Node) -> bool:
        """False only when no match of ``rule`` can be rooted at ``node``."""
        entry = self.of(rule)
        return entry is None or entry.may_match(node)

    def of(self, rule: Any) -> _RuleReach | None:
        """``rule``'s reach (``may_match(node)``), None where it may match anywhere."""
        key = id(rule)
        if key not in self._rules:
            self._keep.append(rule)
            self._rules[key] = self._reach(rule)
        return self._rules[key]

    def _reach(self, rule: Any) -> _RuleReach | None:
        if len(rule.roots) != 1:
            return None
        root = rule.roots[0]
        counts = _counts(root, self.graph)
        req = requirement(root, self.graph, counts)
        if req is None:
            return None
        return _RuleReach(rule, self.graph, req, counts)

    def touched(self, created: Sequence[Node], rewired: Sequence[Node]) -> None:
        """A rewrite created ``created`` and gave ``rewired`` the uses of what it replaced."""
        for entry in self._rules.values():
            if entry is not None:
                entry.touched(created, rewired)


def _levels(seeds: Iterable[Node], depth: int) -> dict[Node, int]:
    """For each node at most ``depth`` uses downstream of ``seeds``: a bit mask of the
    lengths of the paths that lead there."""
    levels: dict[Node, int] = {}
    level = list(dict.fromkeys(seeds))
    for d in range(depth + 1):
        bit = 1 << d
        for n in level:
            levels[n] = levels.get(n, 0) | bit
        if d == depth:
            break
        level = list(dict.fromkeys(u for n in level for u in n.users))
    return levels


def _downstream(seeds: Iterable[Node], depth: int, marked: set[Node]) -> None:
    """Add to ``marked`` every node at most ``depth`` uses downstream of ``seeds``."""
    level = list(dict.fromkeys(seeds))
    seen = set(level)
    marked.update(level)
    for _ in range(depth):
        nxt = []
        for n in level:
            for u in n.users:
                if u not in seen:
                    seen.add(u)
                    nxt.append(u)
        if not nxt:
            return
        marked.update(nxt)
        level = nxt
