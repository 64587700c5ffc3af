"""Explain a miss: why a rule did not match at a node, or anywhere in a graph.

>>> import torch
>>> from torch.fx.experimental.proxy_tensor import make_fx
>>> from fxpass.rewrite import P, Rule, explain, rules
>>> x = P.var("x")
>>> rule = Rule(P(torch.ops.aten.mul.Tensor, x, 1), lambda x: x, name="mul_one")
>>> gm = make_fx(lambda t: (t * 1).relu())(torch.randn(2, 3))
>>> node = list(gm.graph.nodes)[-2]
>>> print(explain(rule, node))      # the first constraint that failed at this node
rule 'mul_one' (...) at %relu: no match: wrong op at the root: the rule starts at aten.mul.Tensor, %relu is aten.relu.default
>>> print(explain(rule, gm))        # where it matched, and its closest miss
rule 'mul_one' (...): matches at 1 of 1 candidate nodes: %mul
>>> rule_set = rules("simplify", [rule])
>>> print(explain(rule_set, gm))    # the same for every rule of a set
rule 'mul_one' (...): matches at 1 of 1 candidate nodes: %mul

:class:`Explainer` replays the search — the interpreter with its handlers overridden to
say why each check failed, as tinygrad swaps in a tracking matcher — and keeps the failure
that came deepest into the pattern (the most nodes matched): wrong op, extra user, literal
differs, dtype/rank/shape, a name bound twice to different values, a predicate, a would-be
cycle. The plain matcher never asks whether it is explaining.
"""

from __future__ import annotations

from collections import UserString
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from torch import fx
from torch.fx import Node

from ..edit.location import short
from ..fxutil.dialect import aten_op
from ..fxutil.fx_internals import is_erased
from ..fxutil.messages import first_line
from ..fxutil.views import view_base_name
from ._state import MISSING, MatchState
from .constraint import constant_number, fn_name, lit_eq, show
from .interpreted import Cont, Interpreter, always, is_a, strict_ok
from .leaves import AnyOf, Pattern
from .match import attempt
from .pattern import P
from .region import Failure, complete, lazy_order
from .rule import Rule, as_rule
from .spelling import CAST_OPS, node_key, op_name

__all__ = [
    "Explainer",
    "Explanation",
    "GraphExplanation",
    "NearMissHint",
    "explain",
    "near_misses",
    "why_nothing",
]


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
    st = MatchState(order=order if order is not None else lazy_order(node.graph))
    if attempt(rule, node, st, _EXPLAINER):
        return Explanation(rule, node, True)
    return Explanation(rule, node, False, st.why or "no match", st.why_node, st.why_depth)


def _explain_graph(rule: Rule, graph: fx.Graph) -> GraphExplanation:
    keys = rule.index_keys()
    order = lazy_order(graph)
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


def near_misses(
    rule: Rule, graph: fx.Graph, *, limit: int = 64, among: Iterable[Node] | None = None
) -> list[Explanation]:
    """The candidate nodes (those calling the rule's root op) where ``rule`` came close:
    matching got through half of the pattern's ops (the root at least) and then failed
    on a check — an extra user, a literal, a dtype or shape, a name bound twice, ``where``,
    a cycle — or on views or casts in front of an op the rule names (which
    :meth:`P.through` sees past), not on a graph that simply computes something else. Replays
    at most ``limit`` unmatched candidates (only those ``among`` the given nodes, when given);
    the deepest misses come first."""
    keys = rule.index_keys()
    need = max(1, min_ops(rule.roots[0]) // 2)
    order = lazy_order(graph)
    out: list[Explanation] = []
    replayed = 0
    for node in graph.nodes if among is None else among:
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


class NearMissHint(UserString):
    """The report's hint for a rule that matched few of the nodes it tried but came close at
    some. Read when the report is shown, it asks again at each near miss, on the graph as the
    later passes left it: a site they fused, or one that is no longer close (Olmo3's rotary
    ``mul`` after its q/k norm, seen through a view, looked like a norm's until
    ``fuse_rmsnorm`` fused that norm) is not reported as missed; with none left, the hint is
    empty and the report leaves it out. It reads as its text (a ``str`` work-alike); copied or
    pickled, it is that text."""

    def __init__(
        self,
        rule: Rule,
        tried: int,
        matched: int,
        misses: list[Explanation] | None = None,
        *,
        graph: fx.Graph | None = None,
    ) -> None:
        self.rule, self.tried, self.matched, self._misses = rule, tried, matched, misses
        self._graph = graph

    @property
    def misses(self) -> list[Explanation]:
        """The near misses, found in ``graph`` at the first read when none were given: a
        pass that made the hint does not pay for the scan unless someone reads it."""
        if self._misses is None:
            graph, self._graph = self._graph, None
            self._misses = near_misses(self.rule, graph) if graph is not None else []
        return self._misses

    def pending(self) -> list[Explanation]:
        """The near misses that are near misses still, in the graph as it is now."""
        if self._misses is None:  # found now, in the graph as it is now: all pending
            return self.misses
        alive = [e.node for e in self.misses if not is_erased(e.node)]
        return near_misses(self.rule, alive[0].graph, among=alive) if alive else []

    @property
    def data(self) -> str:  # what UserString's methods read
        misses = self.pending()
        if not misses:
            return ""
        many = f"{len(misses)}{'+' if len(self.misses) >= 64 else ''}"
        lines = [
            f"rule '{self.rule.name}' was tried at {self.tried} nodes and matched "
            f"{self.matched}; {many} near miss{'es' if len(misses) != 1 else ''}, e.g."
        ]
        for e in misses[:2]:
            where = f" [at %{e.at.name}]" if e.at is not None and e.at is not e.node else ""
            lines.append(f"  %{e.node.name}: {e.reason}{where}")
        lines.append(
            "  (near miss: the root op and half the pattern or more matched; "
            f"fxpass.rewrite.explain(rule, gm) says why; rule at {short(self.rule.location)})"
        )
        return "\n".join(lines)

    def __reduce__(self) -> Any:
        return (str, (self.data,))

    def __deepcopy__(self, memo: dict) -> str:
        return self.data


def why_nothing(
    rules: Iterable[Rule], stats: dict[str, Any], graphs: Iterable[tuple[str, fx.Graph]] = ()
) -> str:
    """Why a rule set rewrote nothing, rule by rule (``stats``: the matcher's per-rule
    counts): no node calls the op it starts at, every candidate failed, or the replacement
    declined every match. What the report notes for a pass that found nothing, in one line.

    Where a rule came close in one of ``graphs`` (``(name, graph)`` pairs; ``""`` names the
    graph the pass was given, others are its control-flow subgraphs), the line names the
    closest near miss and why it missed (:func:`near_misses`); where candidates were tried
    and none came close, it points to :func:`explain`."""
    rules = list(rules)
    reasons: dict[str, list[str]] = {}
    for rule in rules:
        s = stats.get(rule.name)
        if s is None or not s.tried:
            why = f"no node calls {_short_ops(rule)}"
        elif not s.matched:
            why = f"tried at {s.tried} nodes, none matched"
        else:
            why = f"matched {s.matched}, the replacement declined each"
        reasons.setdefault(why, []).append(f"'{rule.name}'")
    text = "; ".join(f"{', '.join(names)}: {why}" for why, names in reasons.items())
    tried = [r for r in rules if (s := stats.get(r.name)) is not None and s.tried]
    closest = _closest_miss(tried, list(graphs))
    if closest is not None:
        name, e = closest
        where = f" [at %{e.at.name}]" if e.at is not None and e.at is not e.node else ""
        inside = f" in {name}" if name else ""
        miss = f"'{e.rule.name}' at %{e.node.name}{inside}: {e.reason}{where}"
        return first_line(f"found nothing to rewrite: {text}; closest near miss: {miss}")
    if tried:
        text += " (fxpass.rewrite.explain(rule, gm) says why)"
    return first_line(f"found nothing to rewrite: {text}")


def _closest_miss(
    rules: list[Rule], graphs: list[tuple[str, fx.Graph]]
) -> tuple[str, Explanation] | None:
    """The deepest near miss of ``rules`` over ``graphs`` (a bounded replay per rule and
    graph; the earliest graph and rule win ties), with the name of its graph."""
    best: tuple[str, Explanation] | None = None
    for rule in rules:
        for name, graph in graphs:
            misses = near_misses(rule, graph, limit=16)
            if misses and (best is None or misses[0].depth > best[1].depth):
                best = (name, misses[0])
    return best


def _short_ops(rule: Rule) -> str:
    """The op a rule starts at, aten's spelling first, the others counted."""
    names = _root_ops(rule).strip("{}").split(", ")
    names.sort(key=lambda n: (not n.startswith("aten."), n))
    return names[0] + (f" (or {len(names) - 1} other spellings)" if len(names) > 1 else "")


#: How a wrong-op miss says the op the pattern wanted is right there, behind views or casts.
_BEHIND_VIEWS = "behind views or casts it would match"


def _close(e: Explanation, rule: Rule) -> bool:
    """A miss on a check, or on views and casts in front of the op the pattern wanted there
    (not merely some op the rule names: Olmo3's rotary ``mul`` sees its q/k norm's
    ``rms_norm`` through a view, which is no residual ``add``)."""
    if not e.reason.startswith("wrong op"):
        return True
    return _BEHIND_VIEWS in e.reason


def _behind_views(node: Node) -> Node | None:
    """The node behind the views and casts in front of ``node`` (None when there are none)."""
    hops = 0
    while _in_the_way(node) and hops < 16:
        node, hops = node.args[0], hops + 1
    return node if hops and isinstance(node, Node) and node.op == "call_function" else None


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
    if _is_rule_tuple(rules):
        return Explanations([explain(as_rule(rules), target)])
    if isinstance(rules, Iterable) and not isinstance(rules, Rule):  # a RuleSet, a list
        return Explanations([explain(as_rule(r), target) for r in rules])
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


# ----- the explaining matcher ---------------------------------------------------------------
class Explainer(Interpreter):
    """The interpreter, saying why: each handler first checks what the plain one checks at
    its own node and records the first failure (:meth:`MatchState.miss` keeps the deepest),
    then hands over to the plain handler for the rest of the search."""

    compiled = False

    def __init__(self) -> None:
        super().__init__()
        self.quick = always  # every ordering is searched, so every failure is seen

    def lit(self, p: Any, v: Any, st: MatchState, k: Cont) -> bool:
        if not self.lit_ok(p.value, v):
            return st.miss(lambda: f"literal differs: expected {p.value!r}, got {show(v)}", v)
        return k()

    def var(self, p: Any, v: Any, st: MatchState, k: Cont) -> bool:
        if not (p._shared and id(p) in st.memo):
            if p.node_only and not isinstance(v, Node):
                return st.miss(lambda: f"expected a node for '{p.name}', got {v!r}", v)
            why = p.constraint.failure(v) if p.constraint is not None else None
            if why is not None:
                return st.miss(lambda: why, v)
        return super().var(p, v, st, k)

    def const(self, p: Any, v: Any, st: MatchState, k: Cont) -> bool:
        if isinstance(v, Node):
            return st.miss(lambda: f"expected a literal for '{p.name}', got node {show(v)}")
        if p.types is not None and not is_a(v, p.types):
            want = "/".join(t.__name__ for t in p.types)
            return st.miss(lambda: f"expected a {want} literal, got {v!r}")
        if p.where is not None and not p.where(v):
            return st.miss(lambda: f"predicate {fn_name(p.where)} is false for {v!r}")
        return super().const(p, v, st, k)

    def scalar(self, p: Any, v: Any, st: MatchState, k: Cont) -> bool:
        number = constant_number(v) if v.__class__ is Node else v
        if not is_a(number, p.types):
            want = "/".join(t.__name__ for t in p.types)
            msg = f"expected a {want} (a literal or a one-element constant), got {show(v)}"
            return st.miss(lambda msg=msg: msg, v)
        return super().scalar(p, v, st, k)

    def seq(self, p: Any, v: Any, st: MatchState, k: Cont) -> bool:
        if not isinstance(v, (list, tuple)) or len(v) != len(p.items):
            return st.miss(lambda: f"expected a sequence of {len(p.items)}, got {show(v)}")
        return super().seq(p, v, st, k)

    def op(self, p: Any, v: Any, st: MatchState, k: Cont) -> bool:
        if v.__class__ is not Node:
            return st.miss(lambda: f"expected a node calling {p.describe_ops()}, got {v!r}")
        if not p.accepts(v):
            return st.miss(lambda: _wrong_op(p, v), v)
        if p._shared and id(p) in st.memo:
            return super().op(p, v, st, k)  # memo_hit explains a mismatch
        why = p.constraint.failure(v, v) if p.constraint is not None else None
        if why is not None:
            return st.miss(lambda: why, v)
        r = p.layout(v.target if v.op == "call_function" else v.op)
        if not r.ok:
            return st.miss(lambda: f"{show(v)}: the pattern's arguments do not fit", v)
        why = _strict_failure(r, v, self.lit_ok)
        if why is not None:
            return st.miss(lambda: why, v)
        vals = r.getter(v.args, v.kwargs)
        for i, lit in r.lits:  # as the plain matcher tries the operands as given first
            if lit is not vals[i] and not self.lit_ok(lit, vals[i]):
                index, name = r.slots[i][0], r.slots[i][1]
                msg = (
                    f"literal differs: argument '{name or f'#{index}'}' of "
                    f"{show(v)} is {show(vals[i])}, expected {lit!r}"
                )
                st.nodes.append(v)
                st.miss(lambda msg=msg: msg, v)
                st.nodes.pop()
                break
        return super().op(p, v, st, k)

    def bind(self, p: Any, v: Any, st: MatchState, k: Cont) -> bool:
        name = p.name
        prev = st.env.get(name, MISSING) if name is not None else MISSING
        if prev is not MISSING and not (prev is v or (not isinstance(v, Node) and lit_eq(prev, v))):
            return st.miss(
                lambda: (
                    f"'{name}' is already bound to {show(prev)}, but here it would be {show(v)}"
                ),
                v,
            )
        return super().bind(p, v, st, k)

    def memo_hit(self, p: Any, v: Any, st: MatchState, k: Cont) -> bool | None:
        prev = st.memo.get(id(p), MISSING)
        if prev is MISSING or prev is v or (not isinstance(v, Node) and lit_eq(prev, v)):
            return super().memo_hit(p, v, st, k)
        if p.name:
            msg = f"'{p.name}' is already bound to {show(prev)}, but here it would be {show(v)}"
        else:
            msg = f"this pattern already matched {show(prev)}; here it meets {show(v)}"
        return st.miss(lambda msg=msg: msg, v)

    def next_root(self, rule: Any, j: int, st: MatchState) -> bool:
        if self.root_candidates(rule, j, st) == []:
            return st.miss(lambda: f"no candidate for root {j + 1} of the pattern")
        return super().next_root(rule, j, st)

    def final(self, rule: Any, st: MatchState) -> bool:
        m = complete(rule, st)
        if isinstance(m, Failure):
            return st.miss(lambda: _whole_failure(m), m.node, whole=True)
        st.found = m
        return True


def _whole_failure(f: Failure) -> str:
    if f.kind == "output":
        return f"output {show(f.node)} is not a node of the match"
    if f.kind == "where":
        if f.detail is None:
            return "the rule's where(...) returned False"
        return f"the rule's where raised {type(f.detail).__name__}: {f.detail}"
    if f.kind == "extra user":
        return (
            f"extra user: %{f.node.name} is also used by %{f.detail.name}, outside the "
            "match (only the rule's outputs may be)"
        )
    return f"would create a cycle: a path leaves the match and comes back through %{f.node.name}"


def _strict_failure(r: Any, v: Node, same: Any) -> str | None:
    """Why ``v``'s arguments break :func:`~fxpass.rewrite.interpreted.strict_ok`, or None."""
    args, kwargs = v.args, v.kwargs
    for index, name, default in r.unmentioned:
        val = args[index] if 0 <= index < len(args) else kwargs.get(name, default)
        if not (val is default or same(default, val)):
            return (
                f"{show(v)}: argument '{name}' is {show(val)}; the pattern "
                f"leaves it out, so it must be its default {default!r}"
            )
    if r.pos_limit >= 0 and not strict_ok(r, args, kwargs, same):
        return (
            f"{show(v)} has other arguments than the pattern ({len(args)} "
            f"positional, keywords {sorted(kwargs)}; the pattern gives "
            f"{r.pos_limit} and {sorted(r.kw_names)})"
        )
    return None


def _wrong_op(p: Any, v: Node) -> str:
    if v.op in ("call_function", "call_method", "call_module"):
        have = op_name(v.target) if v.op != "call_module" else f"module {v.target}"
    else:
        have = f"a {v.op}"
    behind = _behind_views(v)
    tail = ""
    if behind is not None and p.accepts(behind):
        tail = f"; %{behind.name} {_BEHIND_VIEWS} (P.through sees past them)"
    return f"wrong op: expected {p.describe_ops()}, got {have} (%{v.name}){tail}"


_EXPLAINER = Explainer()
