"""The interpreted matcher: patterns matched by a backtracking search.

:class:`Interpreter` walks a pattern in continuation-passing style: the handler for each
pattern class checks its own constraints, records what it bound, calls ``k()`` for the rest
of the pattern and undoes its bindings when ``k`` fails. It supports every feature —
alternatives, views seen through, multi-root patterns — and is the reference semantics that
:mod:`~fxpass.rewrite.compile` generates straight-line code for.

The plain interpreter only matches. Other ways of matching are subclasses that override
handlers, so the plain one never asks which mode it is in: the explaining matcher
(:class:`fxpass.rewrite.explain.Explainer`) records why a match failed, and
:class:`fxpass.rewrite.torchlike.TorchMatching` follows torch's ``SubgraphMatcher`` rules.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch.fx import Node

from ..fxutil.dialect import aten_op
from ..fxutil.fx_internals import node_args, node_kwargs
from ._state import MISSING, MatchState
from .arguments import Layout
from .constraint import constant_number, lit_eq
from .leaves import AnyOf, Const, Lit, Pattern, Scalar, Seq, Through, Var
from .pattern import P
from .region import Match, complete

__all__ = ["Interpreter", "strict_ok"]

Cont = Callable[[], bool]


class _Handlers(dict):
    """Pattern class -> the interpreter's bound handler; a subclass of a pattern class
    takes its nearest base's handler (looked up once)."""

    def __init__(self, interp: Interpreter) -> None:
        super().__init__()
        self.interp = interp

    def __missing__(self, cls: type) -> Callable[..., bool]:
        for base in cls.__mro__:
            name = self.interp.HANDLERS.get(base)
            if name is not None:
                fn = self[cls] = getattr(self.interp, name)
                return fn
        raise TypeError(f"no matcher for pattern class {cls.__name__}")


def is_a(v: Any, types: tuple) -> bool:
    """``isinstance``, except that a bool is no int unless ``types`` names bool."""
    return isinstance(v, types) and not (type(v) is bool and bool not in types and int in types)


class Interpreter:
    """Matches patterns and rules by backtracking search (see the module docstring)."""

    HANDLERS: dict[type, str] = {
        Lit: "lit",
        Var: "var",
        Const: "const",
        Seq: "seq",
        AnyOf: "any_of",
        Through: "through",
        Scalar: "scalar",
        P: "op",
    }
    #: Whether a rule's compiled matcher (same semantics, plain mode) may stand in for it.
    compiled = True

    def __init__(self) -> None:
        self.m = _Handlers(self)
        self.lit_ok: Callable[[Any, Any], bool] = lit_eq
        self.quick: Callable[[Layout, list], bool] = _quick

    def match(self, p: Pattern, v: Any, st: MatchState, k: Cont) -> bool:
        """Match ``p`` against ``v``, then the rest of the pattern (``k``)."""
        return self.m[p.__class__](p, v, st, k)

    # ----- rules ------------------------------------------------------------------------
    def match_rule(self, rule: Any, node: Node, st: MatchState) -> bool:
        """Match ``rule`` rooted at ``node`` (``st`` reset, roots set); the match goes to
        ``st.found``."""
        return self.match(rule.roots[0], node, st, self._cont(rule, 1, st))

    def _cont(self, rule: Any, j: int, st: MatchState) -> Cont:
        if j == len(rule.roots):
            return lambda: self.final(rule, st)
        return lambda: self.next_root(rule, j, st)

    def root_candidates(self, rule: Any, j: int, st: MatchState) -> list[Node] | None:
        """The nodes root ``j`` of a multi-root rule may match, from what the earlier roots
        bound (its link to them, that many users down)."""
        link, depth = rule.links[j - 1]
        start = st.memo.get(id(link), MISSING) if not isinstance(link, str) else st.env.get(link)
        if not isinstance(start, Node):
            return None
        level = [start]
        for _ in range(depth):
            nxt: dict[Node, None] = {}
            for n in level:
                for u in n.users:
                    nxt[u] = None
            level = list(nxt)
        return level

    def next_root(self, rule: Any, j: int, st: MatchState) -> bool:
        level = self.root_candidates(rule, j, st)
        if not level:
            return False
        k = self._cont(rule, j + 1, st)
        root = rule.roots[j]
        roots = st.roots
        for cand in level:
            roots.append(cand)
            if self.match(root, cand, st, k):
                return True
            roots.pop()
        return False

    def final(self, rule: Any, st: MatchState) -> bool:
        """The whole-match checks (:func:`~fxpass.rewrite.region.complete`)."""
        m = complete(rule, st)
        if m.__class__ is Match:
            st.found = m
            return True
        return False

    # ----- binding ----------------------------------------------------------------------
    def bind(self, p: Pattern, v: Any, st: MatchState, k: Cont) -> bool:
        """Bind ``p.name`` (and the DAG memo) to ``v``, run ``k``, undo on failure."""
        name = p.name
        fresh = False
        if name is not None:
            prev = st.env.get(name, MISSING)
            if prev is MISSING:
                st.env[name] = v
                fresh = True
            elif not (prev is v or (not isinstance(v, Node) and lit_eq(prev, v))):
                return False
        shared = p._shared
        if shared:
            st.memo[id(p)] = v
        if k():
            return True
        if fresh:
            del st.env[name]
        if shared:
            st.memo.pop(id(p), None)
        return False

    def memo_hit(self, p: Pattern, v: Any, st: MatchState, k: Cont) -> bool | None:
        """None if the shared pattern ``p`` has not matched yet; else whether ``v`` is what
        it matched (and the rest of the pattern, ``k``, matches)."""
        prev = st.memo.get(id(p), MISSING)
        if prev is MISSING:
            return None
        if prev is v or (not isinstance(v, Node) and lit_eq(prev, v)):
            return k()
        return False

    # ----- leaves -----------------------------------------------------------------------
    def lit(self, p: Lit, v: Any, st: MatchState, k: Cont) -> bool:
        return k() if self.lit_ok(p.value, v) else False

    def var(self, p: Var, v: Any, st: MatchState, k: Cont) -> bool:
        if p._shared:
            hit = self.memo_hit(p, v, st, k)
            if hit is not None:
                return hit
        if p.node_only and not isinstance(v, Node):
            return False
        c = p.constraint
        if c is not None and c.failure(v) is not None:
            return False
        return self.bind(p, v, st, k)

    def const(self, p: Const, v: Any, st: MatchState, k: Cont) -> bool:
        if isinstance(v, Node):
            return False
        if p.types is not None and not is_a(v, p.types):
            return False
        if p.where is not None and not p.where(v):
            return False
        if p._shared:
            hit = self.memo_hit(p, v, st, k)
            if hit is not None:
                return hit
        return self.bind(p, v, st, k)

    def scalar(self, p: Scalar, v: Any, st: MatchState, k: Cont) -> bool:
        number = constant_number(v) if v.__class__ is Node else v
        if not is_a(number, p.types):
            return False
        if p._shared:
            hit = self.memo_hit(p, number, st, k)
            if hit is not None:
                return hit
        return self.bind(p, number, st, k)

    # ----- structure --------------------------------------------------------------------
    def seq(self, p: Seq, v: Any, st: MatchState, k: Cont) -> bool:
        if not isinstance(v, (list, tuple)) or len(v) != len(p.items):
            return False
        return self.chain(p.items, list(v), 0, st, k)

    def any_of(self, p: AnyOf, v: Any, st: MatchState, k: Cont) -> bool:
        if p._shared:
            hit = self.memo_hit(p, v, st, k)
            if hit is not None:
                return hit
        then = k if p.name is None and not p._shared else lambda: self.bind(p, v, st, k)
        return any(self.option(p, i, v, st, then) for i in range(len(p.options)))

    def option(self, p: AnyOf, i: int, v: Any, st: MatchState, k: Cont) -> bool:
        """Match ``v`` by option ``i`` of ``p``, then ``k``."""
        o = p.options[i]
        return self.m[o.__class__](o, v, st, k)

    def through(self, p: Through, v: Any, st: MatchState, k: Cont) -> bool:
        if p._shared:
            hit = self.memo_hit(p, v, st, k)
            if hit is not None:
                return hit
        then = k if p.name is None and not p._shared else lambda: self.bind(p, v, st, k)
        chain: list[Node] = []
        cur = v
        while True:
            if self.behind(p, chain, cur, st, then):
                return True
            nxt = p.step(cur)
            if nxt is None or len(chain) >= p.MAX_CHAIN:
                return False
            chain.append(cur)
            cur = nxt

    def behind(self, p: Through, chain: list[Node], cur: Any, st: MatchState, k: Cont) -> bool:
        """Match ``p``'s inner pattern at ``cur``, behind the views ``chain`` (outermost
        first) that ``p`` saw through, then ``k``."""
        inner = p.inner
        m = self.m[inner.__class__]
        if not chain:
            return m(inner, cur, st, k)
        st.chains.append(tuple(reversed(chain)))  # innermost first
        if m(inner, cur, st, k):
            return True
        st.chains.pop()
        return False

    def op(self, p: P, v: Any, st: MatchState, k: Cont) -> bool:
        if v.__class__ is not Node:
            return False
        op = v.op
        if op == "call_function":
            t = v.target
            r = p._cache.get(id(t))
            if r is None or id(t) not in p.fn_ids:
                r = p.layout(t) if p.accepts(v) else None
        elif op == "call_method" or op == "call_module":
            r = p.layout(op) if p.accepts(v) else None
        else:
            r = None
        if r is None:
            r = self.unlisted(p, v)
            if r is None:
                return False
        if p._shared:
            hit = self.memo_hit(p, v, st, k)
            if hit is not None:
                return hit
        c = p.constraint
        if c is not None and c.failure(v, v) is not None:
            return False
        if not r.ok:
            return False
        args, kwargs = node_args(v), node_kwargs(v)
        if (r.unmentioned or r.pos_limit >= 0) and not strict_ok(r, args, kwargs, self.lit_ok):
            return False
        vals = r.getter(args, kwargs)
        quick = self.quick
        nodes = st.nodes
        nodes.append(v)
        then = k if p.name is None and not p._shared else lambda: self.bind(p, v, st, k)
        if (not r.quick or quick(r, vals)) and self.args(r, vals, st, then):
            return True
        if p.commutative and r.swap is not None:  # the other operand order
            i, j = r.swap
            vals = list(vals)
            vals[i], vals[j] = vals[j], vals[i]
            if (not r.quick or quick(r, vals)) and self.args(r, vals, st, then):
                return True
        nodes.pop()
        return False

    def unlisted(self, p: P, v: Node) -> Layout | None:
        """The layout to match ``v`` with although it calls none of ``p``'s ops: None."""
        return None

    def args(self, r: Layout, vals: list, st: MatchState, k: Cont) -> bool:
        lit_ok = self.lit_ok
        for i, lit in r.lits:
            val = vals[i]
            if lit is not val and not lit_ok(lit, val):
                return False
        return self.run(r.subs, vals, st, k)

    def run(self, subs: list[tuple], vals: list, st: MatchState, k: Cont) -> bool:
        """Match ``subs`` against their slot values, then ``k``."""
        n = len(subs)
        if n == 0:
            return k()
        m = self.m
        i0, p0 = subs[0]
        if n == 1:
            return m[p0.__class__](p0, vals[i0], st, k)
        i1, p1 = subs[1]
        if n == 2:
            m1 = m[p1.__class__]
            return m[p0.__class__](p0, vals[i0], st, lambda: m1(p1, vals[i1], st, k))
        return m[p0.__class__](p0, vals[i0], st, lambda: self.run(subs[1:], vals, st, k))

    def chain(self, pats: list, vals: list, i: int, st: MatchState, k: Cont) -> bool:
        last = len(pats) - 1
        if i > last:
            return k()
        p = pats[i]
        if i == last:
            return self.m[p.__class__](p, vals[i], st, k)
        return self.m[p.__class__](p, vals[i], st, lambda: self.chain(pats, vals, i + 1, st, k))


def strict_ok(r: Layout, args: tuple, kwargs: dict, same: Callable[[Any, Any], bool]) -> bool:
    """Arguments the pattern leaves out must be defaults (with a schema); without a schema
    the node has exactly the arguments the pattern gives (at least them, after ``...``)."""
    for index, name, default in r.unmentioned:
        val = args[index] if 0 <= index < len(args) else kwargs.get(name, default)
        if not (val is default or same(default, val)):
            return False
    if r.pos_limit >= 0:
        n, names = len(args), r.kw_names
        if r.free:
            return n >= r.pos_limit and all(key in kwargs for key in names)
        return n == r.pos_limit and len(kwargs) == len(names) and all(k in names for k in kwargs)
    return True


def _quick(r: Layout, vals: list) -> bool:
    """A cheap look one level down: each op-pattern argument is a node calling a right op."""
    for i, keys, packets in r.quick:
        x = vals[i]
        if x.__class__ is not Node:
            return False
        op = x.op
        if op == "call_function":
            t = x.target
            if id(t) not in keys and not (
                packets and id(getattr(t, "overloadpacket", None)) in keys
            ):
                a = aten_op(t)  # an Edge spelling?
                if a is t or not (
                    id(a) in keys or (packets and id(getattr(a, "overloadpacket", None)) in keys)
                ):
                    return False
        elif (op[5:], x.target) not in keys:
            return False
    return True


def always(*_: Any) -> bool:
    """A quick look that lets everything through (matchers that must see every attempt)."""
    return True
