"""Learned paths: the way a rule's matches go through its alternatives, compiled after use.

A rule with alternatives — every spelling of RMSNorm — is matched by a backtracking search
(:mod:`~fxpass.rewrite.specialize`) that, at each node, works its way through the
alternatives. Within one model every site of a rule is spelled the same way, so the search
makes the same choices site after site. After a match, :func:`learned` reads the path it
took once, with the reference interpreter: which option at each
:class:`~fxpass.rewrite.AnyOf`, how many views each :meth:`P.through
<fxpass.rewrite.P.through>` saw through, the target of each op. A *forced* path is compiled
to straight-line code (:func:`~fxpass.rewrite.compile.compile_path`) that later attempts run
first, falling back to the search when it does not match.

Forced: at every choice, the options the search tries before the one taken cannot start a
match at that node by its op alone (an op pattern whose ops do not include the node's
target; a run of views whose nodes the inner pattern's ops do not include); each op's
operands in their first order. The compiled path expects, at each choice, a node calling
the op recorded there, so at any node it matches, every way the search would try first fails
by the op, and the structure it finds is the one the search finds first. When the rule's
whole-match checks (``final``) turn that structure down, the search runs as before (it tries
later ways after it). A path that is not forced is never compiled; the same matches are found
either way, only sooner.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch.fx import Node

from ._state import MatchState
from .arguments import Layout
from .compile import NOT_A_NODE, MatchPath, compile_path
from .interpreted import Interpreter, always
from .leaves import AnyOf, Pattern, Through
from .pattern import P

__all__ = ["learned"]

Match = Callable[[Node, MatchState, Any], bool]


def may_start(p: Pattern, v: Any) -> bool:
    """False only where ``p`` cannot match ``v``, judged by ``v``'s op alone."""
    if isinstance(p, P):
        if v.__class__ is not Node:
            return False
        op = v.op
        if op == "call_function":
            return p.accepts(v) and p.layout(v.target).ok
        if op == "call_method" or op == "call_module":
            return p.accepts(v) and p.layout(op).ok
        return False
    if p.__class__ is AnyOf and not p._shared:
        return any(may_start(o, v) for o in p.options)
    return True


def _at(v: Any) -> Any:
    """What a compiled path checks of a value where a choice depended on its op: the target
    of a call_function node, ``("op", kind)`` for a placeholder or ``get_attr`` node (no op
    pattern starts there), :data:`NOT_A_NODE`, or None (cannot be checked so)."""
    if v.__class__ is not Node:
        return NOT_A_NODE
    op = v.op
    if op == "call_function":
        return v.target
    return ("op", op) if op in ("placeholder", "get_attr") else None


class _Trail(Interpreter):
    """The plain interpreter, recording the choices of the match it finds: ``trail`` holds
    (kind, id(pattern), choice, forced) for the choices on the way being tried."""

    def __init__(self) -> None:
        super().__init__()
        self.quick = always  # every operand order reaches args(), so the count tells the order
        self.trail: list[tuple[str, int, Any, bool]] = []
        self._ops: list[list[Any]] = []  # per op being matched: [pattern, node, tries]
        self.path: MatchPath | None = None
        self.forced = False

    def option(self, p: AnyOf, i: int, v: Any, st: MatchState, k: Any) -> bool:
        options = p.options
        at = _at(v) if i else None
        forced = i == 0 or (at is not None and not any(may_start(q, v) for q in options[:i]))
        self.trail.append(("option", id(p), (i, at), forced))
        if super().option(p, i, v, st, k):
            return True
        self.trail.pop()
        return False

    def behind(self, p: Through, chain: list[Node], cur: Any, st: MatchState, k: Any) -> bool:
        targets = tuple(_at(n) for n in chain)
        # the inner pattern was tried at every node of the chain first: by its op?
        inner = p.inner
        forced = all(t is not None and not may_start(inner, n) for n, t in zip(chain, targets))
        self.trail.append(("chain", id(p), targets, forced))
        if super().behind(p, chain, cur, st, k):
            return True
        self.trail.pop()
        return False

    def op(self, p: P, v: Any, st: MatchState, k: Any) -> bool:
        self._ops.append([p, v, 0])
        try:
            return super().op(p, v, st, k)
        finally:
            self._ops.pop()

    def args(self, r: Layout, vals: list, st: MatchState, k: Any) -> bool:
        # the op calling: it tries its operands in one order, then maybe the other
        frame = self._ops[-1]
        p, v, tries = frame
        frame[2] = tries + 1
        at = _at(v)
        self.trail.append(("op", id(p), at, tries == 0 and v.op == "call_function"))
        if super().args(r, vals, st, k):
            return True
        self.trail.pop()
        return False

    def final(self, rule: Any, st: MatchState) -> bool:
        if not super().final(rule, st):
            return False
        options, chains, targets = {}, {}, {}
        table = {"option": options, "chain": chains, "op": targets}
        for kind, key, choice, _ in self.trail:
            table[kind][key] = choice
        self.path = MatchPath(options, chains, targets)
        self.forced = all(forced for *_, forced in self.trail)
        return True


class _Learned:
    """``match(node, st, final)``: the compiled paths first, then the search; a match of the
    search whose path is forced adds that path (up to :attr:`LIMIT`; learning stops after
    :attr:`MISSES` matches that taught nothing)."""

    LIMIT = 8
    MISSES = 16

    def __init__(self, rule: Any, search: Match) -> None:
        self.rule = rule
        self.search = search
        self.fns: list[Callable[..., bool | None]] = []
        self.keys: set[tuple] = set()
        self.misses = 0

    def __call__(self, node: Node, st: MatchState, final: Any) -> bool:
        for fn in self.fns:
            hit = fn(node, st, final)
            if hit:
                return True
            if hit is None:  # the search's first structure, turned down: it goes on from there
                st.reset()
                st.roots = [node]
                return self.search(node, st, final)
        ok = self.search(node, st, final)
        if ok and len(self.fns) < self.LIMIT and self.misses < self.MISSES:
            self._learn(node, st)
        return ok

    def _learn(self, node: Node, st: MatchState) -> None:
        trail = _Trail()
        ref = MatchState(order=st.order)
        ref.roots = [node]
        path = trail.path if trail.match_rule(self.rule, node, ref) else None
        key = path.key() if path is not None else None
        if path is None or not trail.forced or key in self.keys:
            self.misses += 1
            return
        compiled = compile_path(self.rule, path)
        if compiled is None:
            self.misses += 1
            return
        self.keys.add(key)
        self.fns.append(compiled.fn)


def learned(rule: Any, search: Match) -> Match:
    """``search`` (a single-root rule's matcher, ``match(node, st, final)``) behind the
    paths its matches teach (see the module)."""
    return _Learned(rule, search)
