"""Specialized matchers: the interpreter's handlers bound to each pattern node, once.

The compiled matcher (:mod:`~fxpass.rewrite.compile`) turns a rule without alternatives into
straight-line code. A rule with alternatives — every spelling of RMSNorm — keeps the
interpreter's backtracking search, whose cost at each step is mostly the looking up: which
handler serves this pattern class, is the pattern named, shared, constrained, commutative.
:func:`specialize_rule` answers those questions once per pattern node and returns closures
that do only the matching, in the same continuation-passing order as
:class:`~fxpass.rewrite.interpreted.Interpreter` (so they find the same match first); the
plain matcher uses them for single-root rules the compiler declines.

Only the pattern classes the interpreter defines are specialized; a rule using another
(a compatibility layer's own pattern kinds) keeps the interpreter.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch.fx import Node

from ..fxutil.fx_internals import node_args, node_kwargs
from ._state import MISSING, MatchState
from .constraint import constant_number, lit_eq
from .interpreted import _quick, is_a, strict_ok
from .leaves import AnyOf, Const, Lit, Pattern, Scalar, Seq, Through, Var
from .pattern import P

__all__ = ["specialize_rule"]

Cont = Callable[[], bool]
Fn = Callable[[Any, MatchState, Cont], bool]


class _Unsupported(Exception):
    pass


def specialize_rule(rule: Any) -> Callable[[Node, MatchState, Any], bool] | None:
    """``match(node, st, final)`` for a single-root ``rule`` (``final(rule, st)``: the
    whole-match checks), or None where the interpreter must match it."""
    if len(rule.roots) != 1:
        return None
    builder = _Builder()
    try:
        for p in rule.roots[0].walk():  # every node now: layouts pick their children later
            builder.fn(p)
    except _Unsupported:
        return None
    root = builder.fn(rule.roots[0])

    def match(node: Node, st: MatchState, final: Any) -> bool:
        return root(node, st, lambda: final(rule, st))

    return match


def _same(prev: Any, v: Any) -> bool:
    return prev is v or (not isinstance(v, Node) and lit_eq(prev, v))


def _binder(p: Pattern) -> Callable[[Any, MatchState, Cont], bool] | None:
    """Binds ``p.name`` (and its DAG memo) to a value, runs the rest, undoes on failure;
    None when ``p`` binds nothing."""
    name, shared, key = p.name, p._shared, id(p)
    if name is None and not shared:
        return None

    def bind(v: Any, st: MatchState, k: Cont) -> bool:
        fresh = False
        if name is not None:
            env = st.env
            prev = env.get(name, MISSING)
            if prev is MISSING:
                env[name] = v
                fresh = True
            elif not _same(prev, v):
                return False
        if shared:
            st.memo[key] = v
        if k():
            return True
        if fresh:
            del st.env[name]
        if shared:
            st.memo.pop(key, None)
        return False

    return bind


def _memo(p: Pattern) -> Callable[[Any, MatchState, Cont], bool | None] | None:
    """For a shared pattern: None if it has not matched yet in this attempt, else whether
    the value is what it matched (and the rest matches)."""
    if not p._shared:
        return None
    key = id(p)

    def hit(v: Any, st: MatchState, k: Cont) -> bool | None:
        prev = st.memo.get(key, MISSING)
        if prev is MISSING:
            return None
        return k() if _same(prev, v) else False

    return hit


def _accept(p: Pattern) -> Fn:
    """Takes a value that passed ``p``'s own checks: ``p``'s memo where it is shared, then
    its binding, then the rest."""
    memo, bind = _memo(p), _binder(p)

    def accept(v: Any, st: MatchState, k: Cont) -> bool:
        if memo is not None:
            hit = memo(v, st, k)
            if hit is not None:
                return hit
        return k() if bind is None else bind(v, st, k)

    return accept


def _then(bind: Any, v: Any, st: MatchState, k: Cont) -> Cont:
    return k if bind is None else (lambda: bind(v, st, k))


class _Builder:
    """One closure per pattern node (a shared node gets one closure for all its uses)."""

    def __init__(self) -> None:
        self.fns: dict[int, Fn] = {}
        self.keep: list[Pattern] = []
        # id(pattern) -> whether a node could start a match of it, judged by its op alone
        # (op patterns; unshared alternatives of them): an alternative that cannot is skipped
        # without a call. Patterns not in it may match anything.
        self.admits: dict[int, Callable[[Node], bool]] = {}

    def fn(self, p: Pattern) -> Fn:
        hit = self.fns.get(id(p))
        if hit is None:
            make = _MAKERS.get(p.__class__)
            if make is None:
                raise _Unsupported(p.__class__.__name__)
            # a forward reference first: a child met again before this node is built
            box: list[Fn] = []
            self.fns[id(p)] = lambda v, st, k: box[0](v, st, k)
            self.keep.append(p)
            hit = make(self, p)
            box.append(hit)
            self.fns[id(p)] = hit
        return hit

    # ----- leaves -----------------------------------------------------------------------
    def lit(self, p: Lit) -> Fn:
        value = p.value
        return lambda v, st, k: k() if lit_eq(value, v) else False

    def var(self, p: Var) -> Fn:
        memo, bind = _memo(p), _binder(p)
        node_only, c = p.node_only, p.constraint

        def var(v: Any, st: MatchState, k: Cont) -> bool:
            if memo is not None:
                hit = memo(v, st, k)
                if hit is not None:
                    return hit
            if node_only and not isinstance(v, Node):
                return False
            if c is not None and c.failure(v) is not None:
                return False
            return k() if bind is None else bind(v, st, k)

        return var

    def const(self, p: Const) -> Fn:
        accept = _accept(p)
        types, where = p.types, p.where

        def const(v: Any, st: MatchState, k: Cont) -> bool:
            if isinstance(v, Node):
                return False
            if types is not None and not is_a(v, types):
                return False
            if where is not None and not where(v):
                return False
            return accept(v, st, k)

        return const

    def scalar(self, p: Scalar) -> Fn:
        accept = _accept(p)
        types = p.types

        def scalar(v: Any, st: MatchState, k: Cont) -> bool:
            number = constant_number(v) if v.__class__ is Node else v
            if not is_a(number, types):
                return False
            return accept(number, st, k)

        return scalar

    # ----- structure --------------------------------------------------------------------
    def seq(self, p: Seq) -> Fn:
        fns = [self.fn(item) for item in p.items]
        n = len(fns)

        def chain(vals: list, i: int, st: MatchState, k: Cont) -> bool:
            if i >= n:
                return k()
            if i == n - 1:
                return fns[i](vals[i], st, k)
            return fns[i](vals[i], st, lambda: chain(vals, i + 1, st, k))

        def seq(v: Any, st: MatchState, k: Cont) -> bool:
            if not isinstance(v, (list, tuple)) or len(v) != n:
                return False
            return chain(list(v), 0, st, k)

        return seq

    def any_of(self, p: AnyOf) -> Fn:
        memo, bind = _memo(p), _binder(p)
        options = [self.fn(o) for o in p.options]
        admits = [self.admits.get(id(o)) for o in p.options]
        # a value that is no node: op patterns never match it
        not_nodes = [f for f, a in zip(options, admits) if a is None]
        # per op: the alternatives a node calling it may match, in order (the target kept)
        by_op: dict[Any, tuple[Any, list[Fn]]] = {}

        def options_for(v: Node) -> list[Fn]:
            t = v.target
            key = id(t) if v.op == "call_function" else (v.op, t)
            hit = by_op.get(key)
            if hit is None or hit[0] is not t:
                fit = [f for f, a in zip(options, admits) if a is None or a(v)]
                hit = by_op[key] = (t, fit)
            return hit[1]

        def any_of(v: Any, st: MatchState, k: Cont) -> bool:
            if memo is not None:
                hit = memo(v, st, k)
                if hit is not None:
                    return hit
            then = _then(bind, v, st, k)
            fit = options_for(v) if v.__class__ is Node else not_nodes
            if len(fit) == 1:  # most nodes' ops admit one alternative
                return fit[0](v, st, then)
            return any(option(v, st, then) for option in fit)

        if memo is None and all(a is not None for a in admits):
            self.admits[id(p)] = lambda v: any(a(v) for a in admits)
        return any_of

    def through(self, p: Through) -> Fn:
        memo, bind = _memo(p), _binder(p)
        inner, step, limit = self.fn(p.inner), p.step, p.MAX_CHAIN

        def through(v: Any, st: MatchState, k: Cont) -> bool:
            if memo is not None:
                hit = memo(v, st, k)
                if hit is not None:
                    return hit
            then = _then(bind, v, st, k)
            chain: list[Node] = []
            cur = v
            while True:
                if not chain:
                    if inner(cur, st, then):
                        return True
                else:
                    st.chains.append(tuple(reversed(chain)))  # innermost first
                    if inner(cur, st, then):
                        return True
                    st.chains.pop()
                nxt = step(cur)
                if nxt is None or len(chain) >= limit:
                    return False
                chain.append(cur)
                cur = nxt

        return through

    def op(self, p: P) -> Fn:
        memo, bind = _memo(p), _binder(p)
        commutative, accepts, layout = p.commutative, p.accepts, p.layout
        # the constraint in two halves: the metadata checks (cheap, and they rule most
        # nodes out) before the arguments; the predicate (a cast's same-shape check reads
        # two fake tensors' sizes) once the arguments matched, so the many attempts that
        # fail on the structure never pay for it. Both are pure: the same nodes match.
        c = p.constraint
        meta = c if c is not None and c.checks_meta() else None
        where = c.where if c is not None else None
        # per target (or method/module name): None where p cannot match such a node, else
        # (its layout, whether arguments left out must be checked, the operand swap, the
        # look-ahead, the argument runner) — worked out once per target
        plans: dict[Any, tuple[Any, Any]] = {}

        def plan_for(v: Node, key: Any, target: Any) -> Any:
            r = layout(target) if accepts(v) else None
            plan = None
            if r is not None and r.ok:
                swap = r.swap if commutative else None
                strict = bool(r.unmentioned) or r.pos_limit >= 0
                plan = (r, strict, swap, r.quick, self._runner(r))
            plans[key] = (v.target, plan)  # the target keeps its id valid
            return plan

        def admits(v: Node) -> bool:
            t = v.target
            key = id(t) if v.op == "call_function" else (v.op, t)
            hit = plans.get(key)
            if hit is not None and (hit[0] is t or v.op != "call_function"):
                return hit[1] is not None
            if v.op not in ("call_function", "call_method", "call_module"):
                return False
            return plan_for(v, key, t if v.op == "call_function" else v.op) is not None

        self.admits[id(p)] = admits

        def op(v: Any, st: MatchState, k: Cont) -> bool:
            if v.__class__ is not Node:
                return False
            kind = v.op
            t = v.target
            if kind == "call_function":
                hit = plans.get(id(t))
                plan = hit[1] if hit is not None and hit[0] is t else plan_for(v, id(t), t)
            elif kind == "call_method" or kind == "call_module":
                hit = plans.get((kind, t))
                plan = hit[1] if hit is not None else plan_for(v, (kind, t), kind)
            else:
                return False
            if plan is None:
                return False
            if memo is not None:
                hit = memo(v, st, k)
                if hit is not None:
                    return hit
            if meta is not None and meta.meta_failure(v) is not None:
                return False
            r, strict, swap, quick, runner = plan
            args, kwargs = node_args(v), node_kwargs(v)
            if strict and not strict_ok(r, args, kwargs, lit_eq):
                return False
            vals = r.getter(args, kwargs)
            nodes = st.nodes
            nodes.append(v)
            then = k if bind is None else (lambda: bind(v, st, k))
            if where is not None:
                then = _checked(where, v, then)
            if (not quick or _quick(r, vals)) and runner(vals, st, then):
                return True
            if swap is not None:  # the other operand order
                i, j = swap
                vals = list(vals)
                vals[i], vals[j] = vals[j], vals[i]
                if (not quick or _quick(r, vals)) and runner(vals, st, then):
                    return True
            nodes.pop()
            return False

        return op

    def _runner(self, r: Any) -> Callable[[list, MatchState, Cont], bool]:
        """Checks a layout's literal arguments, then matches its sub-patterns in order."""
        lits = tuple(r.lits)
        subs = [(i, self.fn(q)) for i, q in r.subs]
        if len(subs) == 0:

            def core(vals: list, st: MatchState, k: Cont) -> bool:
                return k()

        elif len(subs) == 1:
            ((i0, f0),) = subs

            def core(vals: list, st: MatchState, k: Cont) -> bool:
                return f0(vals[i0], st, k)

        elif len(subs) == 2:
            (i0, f0), (i1, f1) = subs

            def core(vals: list, st: MatchState, k: Cont) -> bool:
                return f0(vals[i0], st, lambda: f1(vals[i1], st, k))

        else:

            def core(vals: list, st: MatchState, k: Cont) -> bool:
                return _run(subs, vals, st, k)

        if not lits:
            return core

        def runner(vals: list, st: MatchState, k: Cont) -> bool:
            for i, lit in lits:
                val = vals[i]
                if lit is not val and not lit_eq(lit, val):
                    return False
            return core(vals, st, k)

        return runner


def _checked(where: Callable[[Any], Any], v: Any, k: Cont) -> Cont:
    """``k`` behind the predicate ``where(v)``, asked the first time the arguments match
    (a predicate that raises says no, as :meth:`Constraint.failure` has it)."""
    holds: list[bool] = []

    def then() -> bool:
        if not holds:
            try:
                holds.append(bool(where(v)))
            except Exception:  # broad: a predicate that raises says no
                holds.append(False)
        return holds[0] and k()

    return then


def _run(subs: list, vals: list, st: MatchState, k: Cont) -> bool:
    """Match each ``(slot, fn)`` against its slot value, in order, then ``k``."""
    n = len(subs)
    if n == 0:
        return k()
    i0, f0 = subs[0]
    if n == 1:
        return f0(vals[i0], st, k)
    i1, f1 = subs[1]
    if n == 2:
        return f0(vals[i0], st, lambda: f1(vals[i1], st, k))
    return f0(vals[i0], st, lambda: _run(subs[1:], vals, st, k))


_MAKERS: dict[type, Callable[[_Builder, Any], Fn]] = {
    Lit: _Builder.lit,
    Var: _Builder.var,
    Const: _Builder.const,
    Seq: _Builder.seq,
    AnyOf: _Builder.any_of,
    Through: _Builder.through,
    Scalar: _Builder.scalar,
    P: _Builder.op,
}
