"""Drivers: apply rules to a graph once, or to a fixpoint with a worklist; rule sets.

>>> import torch
>>> from torch.fx.experimental.proxy_tensor import make_fx
>>> from fxpass.rewrite import P, Rule, rewrite
>>> x = P.var("x")
>>> my_rules = [Rule(P(torch.ops.aten.mul.Tensor, x, 1), lambda x: x, name="mul_one")]
>>> gm = make_fx(lambda t: (t * 1) * 1)(torch.randn(2, 3))
>>> result = rewrite(gm, my_rules)              # to a fixpoint
>>> print(result)                               # rewrites and per-rule statistics
2 rewrites (fixpoint) in ... ms
  rule       tried matched rewritten       ms
  mul_one        2       2         2     ...
>>> rewrite(gm, my_rules, once=True).rewrites   # one walk over the graph: nothing left
0

Both walk the graph in order and, at each node, try the rules filed under its op in
priority order; the first that matches and does not decline is applied. Overlapping
matches are thus resolved deterministically: the earliest root in graph order wins, then the
earliest rule. The fixpoint driver then revisits what each rewrite touched (the new nodes,
their users, and the users of the match's inputs) until nothing matches, and stops with
:class:`~fxpass.core.NonConvergenceError` after ``max_rewrites`` rewrites.

A :class:`RuleSet` is rules as data (an ordered list, composed with ``+``) that runs as a
pass through these drivers.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from torch import fx
from torch.fx import Node

from ..core.context import PassContext, current_context
from ..core.contract import Pass, PassResult
from ..core.errors import NonConvergenceError
from ..edit.editor import Editor
from ..edit.location import short
from ..fxutil.dialect import spellings
from ..fxutil.fx_internals import is_erased, sort_key
from ..fxutil.subgraphs import control_flow_subgraphs
from ._state import MatchState
from .explain import NearMissHint, explain, why_nothing
from .interpreted import Interpreter
from .match import Matcher, RuleStats
from .reach import Reach
from .rewriter import Rewriter
from .rule import Rule, as_rule

__all__ = ["RewriteResult", "RuleSet", "rewrite", "rules"]


@dataclass
class RewriteResult:
    """What a rewrite run did: how many rewrites, and per-rule statistics."""

    rewrites: int = 0
    stats: dict[str, RuleStats] = field(default_factory=dict)
    seconds: float = 0.0
    mode: str = "fixpoint"

    @property
    def modified(self) -> bool:
        return self.rewrites > 0

    def __str__(self) -> str:
        lines = [f"{self.rewrites} rewrites ({self.mode}) in {self.seconds * 1000:.1f} ms"]
        width = max((len(n) for n in self.stats), default=4)
        lines.append(f"  {'rule':<{width}}  {'tried':>7} {'matched':>7} {'rewritten':>9} {'ms':>8}")
        for name, s in self.stats.items():
            lines.append(
                f"  {name:<{width}}  {s.tried:>7} {s.matched:>7} {s.rewritten:>9} "
                f"{s.seconds * 1000:>8.2f}"
            )
        return "\n".join(lines)


def _matcher_of(rules: Any) -> tuple[Matcher, str, Any]:
    if isinstance(rules, RuleSet):
        return rules.matcher(), rules.name, rules
    if isinstance(rules, Rule):
        return Matcher([rules]), rules.name, None
    if isinstance(rules, Matcher):
        return rules, "rules", None
    if isinstance(rules, Iterable):
        rs = RuleSet("rules", [as_rule(r) for r in rules])
        return rs.matcher(), rs.name, rs
    raise TypeError(
        f"rewrite() takes a Rule, a RuleSet or a list of rules, not {type(rules).__name__}"
    )


def rewrite(
    gm: fx.GraphModule | fx.Graph,
    rules: Any,
    *,
    once: bool = False,
    max_rewrites: int | None = None,
    pass_name: str | None = None,
    subgraphs: bool = True,
    ctx: PassContext | None = None,
) -> RewriteResult:
    """Apply ``rules`` (a rule, a rule set, or a list of rules and tuples) to ``gm``.

    With ``subgraphs`` (the default) the rules are applied inside the graphs ``gm``'s
    control flow runs too — ``torch.cond`` branches, ``torch.map``/``while_loop``/``scan``
    bodies, nested ones included (:func:`~fxpass.fxutil.subgraphs.control_flow_subgraphs`)
    — and their code is regenerated; ``max_rewrites`` then bounds each graph.
    Each single rewrite is atomic. Statistics (``rewrites``, ``<rule>.tried``/``matched``/
    ``rewritten``/``ms``) go to the running pass's record when called inside a pipeline.
    The caller regenerates code (``gm.recompile()``) unless a pipeline does it.

    ``ctx`` is the context of the pass calling it (what a pass that asks for its context is
    handed): the rewrites go through ``ctx.editor`` and the statistics to its record. Without
    one — a call on a bare GraphModule, or from a pass that did not ask for its context —
    they go to the run in progress, if any (``Editor.current``).
    """
    matcher, name, _ = _matcher_of(rules)
    matcher.reset_stats()
    if ctx is None:
        ctx = current_context()
    pass_name = pass_name or _pass_name(name, ctx)
    editor = ctx.editor.naming(pass_name) if ctx is not None else Editor.current(pass_name)
    t0 = time.perf_counter()
    rewrites, graph = _rewrite_graph(gm, matcher, once, max_rewrites, name, editor)
    graphs = [("", graph)]
    if subgraphs and isinstance(gm, fx.GraphModule):
        for path, sub in list(control_flow_subgraphs(gm)):
            made, sub_graph = _rewrite_graph(sub, matcher, once, max_rewrites, name, editor)
            graphs.append((path, sub_graph))
            if made:
                rewrites += made
                sub.recompile()  # the caller regenerates gm's code; its subgraphs' is ours
    result = RewriteResult(
        rewrites=rewrites,
        stats=dict(matcher.stats),
        seconds=time.perf_counter() - t0,
        mode="once" if once else "fixpoint",
    )
    _report(result, matcher, graphs, ctx)
    return result


def _rewrite_graph(
    gm: fx.GraphModule | fx.Graph,
    matcher: Matcher,
    once: bool,
    max_rewrites: int | None,
    name: str,
    editor: Editor,
) -> tuple[int, fx.Graph]:
    """Rewrite one graph (not the graphs its control flow runs); its rewrites and the graph."""
    rw = Rewriter(gm, editor=editor)
    st = MatchState(order=rw.order)
    # the plain matcher's rules match only near the ops they name (see .reach)
    reach = Reach(rw.graph) if type(matcher.interp) is Interpreter else None
    if once:
        _walk_once(rw, matcher, st, reach)
    else:
        graph = rw.graph
        limit = max_rewrites if max_rewrites is not None else 10 * len(graph.nodes) + 100
        _fixpoint(rw, matcher, st, limit, name, reach)
    return rw.rewrites, rw.graph


def _pass_name(default: str, ctx: PassContext | None) -> str:
    if ctx is not None and ctx.pass_path:
        return ctx.pass_path[-1]
    return default


def _rewrite_at(
    node: Node,
    rw: Rewriter,
    matcher: Matcher,
    st: MatchState,
    reach: Reach | None,
    track_inputs: bool = False,
    reached: bool = False,
) -> Any:
    """Try the node's rules in order; the applied match, or None. ``reached``: the reach
    was asked about ``node`` already (and said it may match)."""
    rules = matcher.rules_for(node)
    for match, s in matcher.matches(rules, node, st, None if reached else reach):
        if track_inputs:  # read them now: erased nodes forget their arguments
            region = set(match.nodes)
            inputs = {a: None for n in match.nodes for a in n.all_input_nodes if a not in region}
        if rw.apply(match, s):
            if track_inputs:
                match.inputs = list(inputs)
            if reach is not None:
                reach.touched(rw.created, rw.rewired)
            return match
    return None


def _walk_once(rw: Rewriter, matcher: Matcher, st: MatchState, reach: Reach | None) -> None:
    wanted = matcher.wanted()
    graph = rw.graph
    candidates = _candidates(graph, matcher) if wanted is not None else None
    if candidates is not None:  # the graph's op index hands us the nodes, in graph order
        only = _single_reach(matcher, reach)
        for node in candidates:
            if is_erased(node):
                continue
            if only is not None and not only[0].may_match(node):
                only[1].tried += 1  # ruled out before any matching
                continue
            _rewrite_at(node, rw, matcher, st, reach, reached=only is not None)
        return
    for node in list(graph.nodes):
        if wanted is not None:  # skip nodes no rule can be rooted at, without a call
            op = node.op
            if op == "call_function":
                if id(node.target) not in wanted:
                    continue
            elif op == "call_method" or op == "call_module":
                if (op[5:], node.target) not in wanted:
                    continue
            else:
                continue
        if not is_erased(node):
            _rewrite_at(node, rw, matcher, st, reach)


def _single_reach(matcher: Matcher, reach: Reach | None) -> tuple[Any, RuleStats] | None:
    """For a matcher of one rule with a reach: (the reach, the rule's statistics)."""
    if reach is None or len(matcher.rules) != 1:
        return None
    rule = matcher.rules[0]
    entry = reach.of(rule)
    return None if entry is None else (entry, matcher.stats[rule.name])


def _candidates(graph: Any, matcher: Matcher) -> list[Node] | None:
    """The nodes some rule is rooted at, in graph order, from torch's op lookup table."""
    found: list[Node] = []
    methods = set()
    for key in matcher._by_key:
        if isinstance(key, tuple):
            if key[0] != "method":
                return None
            methods.add(key[1])
        else:
            target = matcher._targets[key]
            for t in (target, *spellings(target)):  # Edge graphs call the Edge spellings
                found.extend(graph.find_nodes(op="call_function", target=t, sort=False))
    if methods:
        found.extend(n for n in graph.find_nodes(op="call_method") if n.target in methods)
    found.sort(key=sort_key)
    return found


def _fixpoint(
    rw: Rewriter, matcher: Matcher, st: MatchState, limit: int, name: str, reach: Reach | None
) -> None:
    work: deque[Node] = deque(rw.graph.nodes)
    queued: set[Node] = set(work)

    def push(n: Node) -> None:
        if n not in queued and not is_erased(n):
            queued.add(n)
            work.append(n)

    while work:
        node = work.popleft()
        queued.discard(node)
        if is_erased(node):
            continue
        match = _rewrite_at(node, rw, matcher, st, reach, track_inputs=True)
        if match is None:
            continue
        if rw.rewrites > limit:
            raise _non_convergence(name, limit, matcher)
        for a in match.inputs:  # their users may match now that the region is gone
            if not is_erased(a):
                for u in a.users:
                    push(u)
        for n in rw.created:
            push(n)
            for u in n.users:
                push(u)


def _non_convergence(name: str, limit: int, matcher: Matcher) -> NonConvergenceError:
    busiest = sorted(matcher.stats.items(), key=lambda kv: -kv[1].rewritten)[:3]
    top = ", ".join(f"'{n}' ({s.rewritten} rewrites)" for n, s in busiest if s.rewritten)
    return NonConvergenceError(
        f"rules '{name}' made more than {limit} rewrites without reaching a fixpoint; "
        f"busiest: {top}. Rules that undo each other (or keep growing the graph) never "
        "converge: fix them, raise max_rewrites, or run with once=True"
    )


#: A rule "tried many nodes and matched few" when it was tried at least this often...
MANY = 8
#: ...and matched at most this share of them; the report then shows its near misses.
FEW = 0.25


def _report(
    result: RewriteResult,
    matcher: Matcher,
    graphs: list[tuple[str, fx.Graph]],
    ctx: PassContext | None,
) -> None:
    if ctx is None:
        return
    record = ctx.record
    if record is not None:
        graph = graphs[0][1]  # a hint looks for its misses when read, in the one graph it names
        for rule in matcher.rules:
            s = result.stats.get(rule.name)
            if s is not None and s.tried >= MANY and s.matched <= FEW * s.tried:
                # lazy: the scan replays the rule at up to 64 candidates, and most reports
                # are never read; an empty hint is left out when the report is shown
                record.hints.append(NearMissHint(rule, s.tried, s.matched, graph=graph))
        if not result.rewrites and matcher.rules:
            note = why_nothing(matcher.rules, result.stats, graphs)
            if note not in record.notes:  # a fixpoint reruns the pass into the same record
                record.notes.append(note)
    ctx.stat("rewrites", result.rewrites)
    for name, s in result.stats.items():
        if not s.tried:
            continue
        ctx.stat(f"{name}.tried", s.tried)
        ctx.stat(f"{name}.matched", s.matched)
        ctx.stat(f"{name}.rewritten", s.rewritten)
        ctx.stat(f"{name}.ms", round(s.seconds * 1000, 3))
        if s.declined:
            ctx.stat(f"{name}.declined", s.declined)
        if s.skipped:
            ctx.stat(f"{name}.skipped", s.skipped)


class RuleSet(Pass):
    """An ordered set of rules, run as one pass. Rule sets compose with ``+``.

    ``once=False`` (default) rewrites to a fixpoint with a worklist, raising
    :class:`~fxpass.core.NonConvergenceError` after ``max_rewrites`` rewrites (default: ten per
    node); ``once=True`` walks the graph once and does not revisit what it created.
    Earlier rules win where several match at the same node.
    """

    edits = "editor"  # the rewriter edits through the editor only
    statistics = {
        "rewrites": "rewrites made",
        "<rule>.tried": "nodes each rule was tried at",
        "<rule>.matched": "matches each rule found",
        "<rule>.rewritten": "matches each rule replaced",
        "<rule>.ms": "milliseconds spent matching each rule",
    }

    def __init__(
        self,
        name: str = "rules",
        rules: Iterable[Any] = (),
        *,
        once: bool = False,
        max_rewrites: int | None = None,
    ) -> None:
        self.name = name
        self.rules: list[Rule] = [as_rule(r) for r in rules]
        self.once = once
        self.max_rewrites = max_rewrites
        self._matcher: Matcher | None = None
        seen: dict[str, Rule] = {}
        for r in self.rules:
            if r.name in seen and seen[r.name] is not r:
                r.name = f"{r.name}@{short(r.location).rsplit('/', 1)[-1]}"
            seen[r.name] = r

    def __add__(self, other: Any) -> RuleSet:
        if isinstance(other, Rule):
            others = [other]
            other_name = other.name
        elif isinstance(other, RuleSet):
            others = other.rules
            other_name = other.name
        else:
            return NotImplemented
        return RuleSet(
            f"{self.name}+{other_name}",
            [*self.rules, *others],
            once=self.once,
            max_rewrites=self.max_rewrites,
        )

    def __iter__(self):
        return iter(self.rules)

    def __len__(self) -> int:
        return len(self.rules)

    def __getitem__(self, name: str) -> Rule:
        for r in self.rules:
            if r.name == name:
                return r
        raise KeyError(f"no rule named {name!r} in {self.name}; rules: {[r.name for r in self]}")

    def matcher(self) -> Matcher:
        if self._matcher is None or self._matcher.rules != self.rules:
            self._matcher = Matcher(self.rules)
        return self._matcher

    def call(self, gm: fx.GraphModule, ctx: PassContext | None = None) -> PassResult:
        result = rewrite(gm, self, once=self.once, max_rewrites=self.max_rewrites, ctx=ctx)
        return PassResult(gm, result.modified)

    def explain(self, target: Any, rule: str | Rule | None = None) -> Any:
        """Why rules (or one rule) did not match at a node or anywhere in a graph."""
        chosen = self[rule] if isinstance(rule, str) else rule
        return explain(chosen if chosen is not None else self, target)

    def __repr__(self) -> str:
        return f"RuleSet({self.name!r}, {len(self.rules)} rules)"


def rules(name: str, items: Iterable[Any], **options: Any) -> RuleSet:
    """A :class:`RuleSet` called ``name`` from rules and ``(pattern, replacement)`` tuples."""
    return RuleSet(name, items, **options)
