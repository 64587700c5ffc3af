"""Rules (a pattern and what to put in its place) and rule sets, which are passes.

>>> import fxpass as fp
>>> from fxpass.rewrite import P, Rule, rules
>>> aten = torch.ops.aten
>>> x = P.var("x")
>>> identities = rules("identities", [
...     (P(aten.mul.Tensor, x, 1), lambda x: x),     # one line per rewrite
...     (P(aten.add.Tensor, x, 0), lambda x: x),
... ])
>>> result = identities(gm)                            # a RuleSet is a pass

A replacement is a function whose parameters are names the pattern binds (plus ``match``
for the :class:`~fxpass.rewrite.Match`). It is called with graph values wrapped as FX
proxies, so ``torch.ops.fxpass.rms_norm(x, w, eps)`` inside it adds a node to the graph. It
returns the value that takes the root's place — for rules with several ``outputs``, a tuple
(root first) or a dict keyed by output name — or ``None`` to decline the match.
"""

from __future__ import annotations

import inspect
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import fx
from torch.fx import Node

from ..core.contract import Pass, PassResult
from ..edit.location import caller_location, short
from ..fxutil.dialect import aten_op
from ._state import MISSING, MatchState
from .order import find_cycle
from .pattern import Pattern, _show, mark_shared

__all__ = ["DROPPABLE_USERS", "Rule", "RuleSet", "as_rule", "rules"]

#: Users of an inner node that do not stop a match; they are erased with it. Export hangs
#: ``aten._assert_tensor_metadata`` off intermediate values, which would otherwise block
#: every fusion until the asserts are removed.
DROPPABLE_USERS: frozenset[Any] = frozenset([torch.ops.aten._assert_tensor_metadata.default])


def _parameters(fn: Callable, what: str, bound: Sequence[str]) -> tuple[tuple[str, ...], bool]:
    """(names to pass, whether fn takes **kwargs); checks that every parameter can be given."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return tuple(bound), True
    names: list[str] = []
    takes_all = False
    for p in sig.parameters.values():
        if p.kind is p.VAR_KEYWORD:
            takes_all = True
        elif p.kind is p.VAR_POSITIONAL:
            continue
        elif p.name == "match" or p.name in bound:
            names.append(p.name)
        elif p.default is p.empty:
            raise TypeError(
                f"{what} parameter '{p.name}' is not a name the pattern binds "
                f"(it binds: {', '.join(bound) or 'nothing'}; 'match' gives the Match)"
            )
    return tuple(names), takes_all


def _call_with(fn: Callable, names: tuple[str, ...], takes_all: bool, env: dict, match: Any):
    if takes_all:
        kwargs = dict(env)
    else:
        kwargs = {n: env[n] for n in names if n in env}
    if "match" in names or takes_all:
        kwargs["match"] = match
    return fn(**kwargs)


class Rule:
    """A pattern, a replacement, and how the match may touch the rest of the graph.

    Args:
        pattern: a :class:`~fxpass.rewrite.Pattern`, or a tuple of patterns that share nodes
            (a multi-root pattern; the first is the anchor the index looks up).
        replacement: ``fn(**bindings)`` returning the new value(s) or None to decline; or a
            :class:`~fxpass.rewrite.Replacement` (a traced graph).
        name: shown in statistics, reports and provenance (default: the replacement's name,
            or ``file:line`` of the rule).
        outputs: names of matched inner nodes whose value is also used outside the match
            (e.g. a residual sum); the replacement returns a value for each, after the root's.
        where: ``pred(**bindings) -> bool``, checked before the match is accepted.
        contained: inner nodes may only be used inside the match (the outputs excepted).
            With False an inner node used elsewhere survives and keeps computing its value.
        drop_users: ops whose nodes hanging off inner nodes are erased with the match.
    """

    def __init__(
        self,
        pattern: Pattern | tuple[Pattern, ...],
        replacement: Any,
        *,
        name: str | None = None,
        outputs: Sequence[str] = (),
        where: Callable[..., bool] | None = None,
        contained: bool = True,
        drop_users: Iterable[Any] = DROPPABLE_USERS,
        location: str | None = None,
    ) -> None:
        roots = tuple(pattern) if isinstance(pattern, (tuple, list)) else (pattern,)
        if not roots or not all(isinstance(r, Pattern) for r in roots):
            raise TypeError(
                f"a rule's pattern must be a Pattern (P(...)) or a tuple of them, got {pattern!r}"
            )
        self.roots = roots
        self.pattern = roots[0] if len(roots) == 1 else roots
        self.replacement = replacement
        self.location = location or caller_location()
        self.outputs = tuple(outputs)
        self.where = where
        self.contained = contained
        self.drop_users = frozenset(drop_users)
        mark_shared(roots)
        bound: list[str] = []
        for r in roots:
            bound += [n for n in r.names() if n not in bound]
        self.bound_names = tuple(bound)
        for out in self.outputs:
            if out not in bound:
                raise ValueError(
                    f"rule output '{out}' is not a name the pattern binds "
                    f"(it binds: {', '.join(bound) or 'nothing'})"
                )
        self.name = name or _default_name(replacement, self.location)
        if hasattr(replacement, "_fxpass_replace"):
            self._params, self._takes_all = (), True
        elif callable(replacement):
            self._params, self._takes_all = _parameters(
                replacement, f"rule '{self.name}': replacement", bound
            )
        else:
            raise TypeError(
                f"rule '{self.name}': replacement must be a function or a Replacement, "
                f"got {replacement!r}"
            )
        self._where_params = (
            _parameters(where, f"rule '{self.name}': where", bound) if where else ((), False)
        )
        self._links = [_link(roots[:j], roots[j], self.name) for j in range(1, len(roots))]
        self._compiled: Any = _UNCOMPILED  # see fxpass.rewrite.compile

    # ----- introspection ----------------------------------------------------------------
    @property
    def n_outputs(self) -> int:
        return len(self.roots) + len(self.outputs)

    def index_keys(self) -> frozenset | None:
        return self.roots[0].index_keys()

    def __repr__(self) -> str:
        return f"Rule({self.name!r}, {self.pattern!r}, at {short(self.location)})"

    # ----- matching ---------------------------------------------------------------------
    def match(self, node: Node, *, order: Any = None) -> Any:
        """The :class:`~fxpass.rewrite.Match` of this rule rooted at ``node``, or None."""
        from .match import Matcher

        return Matcher([self]).match_rule(self, node, order=order)

    def _try(self, node: Node, st: MatchState) -> bool:
        st.reset()
        st.roots = [node]
        if st.plain:
            compiled = self._compiled
            if compiled is _UNCOMPILED:
                from .compile import compile_rule

                compiled = self._compiled = compile_rule(self)
            if compiled is not None:
                return compiled.fn(node, st, self._final)
        return self.roots[0]._m(node, st, self._cont(1, st))

    def _cont(self, j: int, st: MatchState) -> Callable[[], bool]:
        if j == len(self.roots):
            return lambda: self._final(st)
        return lambda: self._next_root(j, st)

    def _next_root(self, j: int, st: MatchState) -> bool:
        link, depth = self._links[j - 1]
        start = st.memo.get(id(link), MISSING) if not isinstance(link, str) else st.env.get(link)
        if not isinstance(start, Node):
            return False
        level = [start]
        for _ in range(depth):
            nxt: dict[Node, None] = {}
            for n in level:
                for u in n.users:
                    nxt[u] = None
            level = list(nxt)
        k = self._cont(j + 1, st)
        root = self.roots[j]
        roots = st.roots
        for cand in level:
            roots.append(cand)
            if root._m(cand, st, k):
                return True
            roots.pop()
        if st.explain and not level:
            st.miss(lambda: f"no candidate for root {j + 1} of the pattern")
        return False

    def _final(self, st: MatchState) -> bool:
        env = st.env
        roots = st.roots
        outs = list(roots)
        for name in self.outputs:
            outs.append(env[name])
        matched = dict.fromkeys(st.nodes)
        soft = _seen_through(st.chains, matched, outs) if st.chains else ()
        for o in outs:
            if o not in matched:
                if st.explain:
                    msg = f"output {_show(o)} is not a node of the match"
                    return st.miss(lambda msg=msg: msg, o, whole=True)
                return False
        if self.where is not None:
            names, takes_all = self._where_params
            try:
                ok = _call_with(self.where, names, takes_all, env, None)
            except Exception as e:
                if st.explain:
                    msg = f"the rule's where raised {type(e).__name__}: {e}"
                    return st.miss(lambda: msg, whole=True)
                return False
            if not ok:
                if st.explain:
                    return st.miss(lambda: "the rule's where(...) returned False", whole=True)
                return False
        dropped: list[Node] = []
        if self.contained:
            out_set = set(outs)
            drop = self.drop_users
            for n in matched:
                if n in out_set:
                    continue
                for u in n.users:
                    if u in matched:
                        continue
                    if drop and u.op == "call_function" and _droppable(u, drop):
                        dropped.append(u)
                        continue
                    if st.explain:
                        return st.miss(
                            lambda n=n, u=u: (
                                f"extra user: %{n.name} is also used by "
                                f"%{u.name}, outside the match (only the rule's outputs may be)"
                            ),
                            n,
                            whole=True,
                        )
                    return False
        if len(outs) > 1 or not self.contained:
            order = st.order() if callable(st.order) else st.order
            if order is not None:
                # every matched node feeds a root, so the last root is the region's end
                hi = max(order[r] for r in roots) if len(roots) > 1 else order[roots[0]]
                via = find_cycle(order, set(matched).union(soft), hi)
                if via is not None:
                    if st.explain:
                        return st.miss(
                            lambda: (
                                f"would create a cycle: a path leaves the match and "
                                f"comes back through %{via.name}"
                            ),
                            via,
                            whole=True,
                        )
                    return False
        st.memo[_OUTS] = outs
        st.memo[_DROPPED] = dropped
        st.memo[_NODES] = matched
        st.memo[_SOFT] = soft
        return True

    # ----- replacing --------------------------------------------------------------------
    def build(self, bindings: dict[str, Any], match: Any) -> Any:
        """Call the replacement (inside the rewriter, with proxies for nodes)."""
        rep = self.replacement
        if hasattr(rep, "_fxpass_replace"):
            return rep._fxpass_replace(match, bindings)
        return _call_with(rep, self._params, self._takes_all, bindings, match)


_UNCOMPILED = object()
_OUTS = -1  # memo slots for the final step's results (ids of objects are never negative)
_DROPPED = -2
_NODES = -3  # the matched nodes, each once, in matching order
_SOFT = -4  # nodes seen through that stay in the graph (see _seen_through)


def _droppable(node: Node, drop: frozenset) -> bool:
    """An unused check (export's assert) of an op in ``drop``, in any spelling."""
    return not node.users and (node.target in drop or aten_op(node.target) in drop)


def _seen_through(chains: list, matched: dict, outs: list) -> list[Node]:
    """Sort the nodes P.through saw through: a chain starting at an inner node of the match
    joins the match (``matched``, in place: it must be used only inside it, and goes with
    it); the others stay in the graph, reading what replaces their input. Returns those."""
    soft: list[Node] = []
    out_set = set(outs)
    for chain in chains:
        start = chain[0].args[0]
        if start in matched and start not in out_set:
            for n in chain:
                matched.setdefault(n, None)
        else:
            soft.extend(n for n in chain if n not in matched)
    return soft


def _default_name(replacement: Any, location: str) -> str:
    name = getattr(replacement, "__name__", None)
    if name and name != "<lambda>":
        return name
    return short(location).rsplit("/", 1)[-1]


def _link(earlier: Sequence[Pattern], root: Pattern, rule_name: str):
    """(shared pattern or bound name, graph depth) connecting ``root`` to earlier roots.

    Depth counts op patterns only: alternatives and lists do not stand for a graph node.
    """
    from .pattern import P as _Op

    seen_ids = {id(p) for r in earlier for p in r.walk()}
    names = {n for r in earlier for n in r.names()}
    queue: deque[tuple[Pattern, int]] = deque([(root, 0)])
    visited: set[int] = set()
    while queue:
        p, depth = queue.popleft()
        if depth and id(p) in seen_ids:
            return p, depth
        if depth and p.name and p.name in names:
            return p.name, depth
        if id(p) in visited:
            continue
        visited.add(id(p))
        if isinstance(p, _Op):
            queue.extend((c, depth + 1) for c in p.children())
        else:
            queue.extendleft((c, depth) for c in reversed(list(p.children())))
    raise ValueError(
        f"rule '{rule_name}': every root of a multi-root pattern must share a node or a "
        "name with the roots before it (so the matcher can find it from there)"
    )


def as_rule(item: Any) -> Rule:
    """A :class:`Rule` from a rule or a ``(pattern, replacement)`` tuple."""
    if isinstance(item, Rule):
        return item
    if isinstance(item, tuple) and len(item) in (2, 3):
        pattern, replacement = item[0], item[1]
        opts: Mapping[str, Any] = item[2] if len(item) == 3 else {}
        first = pattern[0] if isinstance(pattern, (tuple, list)) else pattern
        loc = getattr(first, "location", None) or caller_location()
        return Rule(
            pattern,
            replacement,
            location=opts.get("location", loc),
            **{k: v for k, v in opts.items() if k != "location"},
        )
    raise TypeError(
        f"expected a Rule or a (pattern, replacement) tuple, got {type(item).__name__}: {item!r}"
    )


class RuleSet(Pass):
    """An ordered set of rules, run as one pass. Rule sets compose with ``+``.

    ``once=False`` (default) rewrites to a fixpoint with a worklist, raising
    :class:`~fxpass.NonConvergenceError` after ``max_rewrites`` rewrites (default: ten per
    node); ``once=True`` walks the graph once and does not revisit what it created.
    Earlier rules win where several match at the same node.
    """

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
        self._matcher: Any = None
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

    def matcher(self) -> Any:
        from .match import Matcher

        if self._matcher is None or self._matcher.rules != self.rules:
            self._matcher = Matcher(self.rules)
        return self._matcher

    def call(self, gm: fx.GraphModule) -> PassResult:
        from .driver import rewrite

        result = rewrite(gm, self, once=self.once, max_rewrites=self.max_rewrites)
        return PassResult(gm, result.modified)

    def explain(self, target: Any, rule: str | Rule | None = None) -> Any:
        """Why rules (or one rule) did not match at a node or anywhere in a graph."""
        from .explain import explain

        chosen = self[rule] if isinstance(rule, str) else rule
        return explain(chosen if chosen is not None else self, target)

    def __repr__(self) -> str:
        return f"RuleSet({self.name!r}, {len(self.rules)} rules)"


def rules(name: str, items: Iterable[Any], **options: Any) -> RuleSet:
    """A :class:`RuleSet` called ``name`` from rules and ``(pattern, replacement)`` tuples."""
    return RuleSet(name, items, **options)
