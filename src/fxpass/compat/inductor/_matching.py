"""Inductor's matching rules, as a policy of fxpass's interpreted matcher.

:class:`InductorMatching` is fxpass's backtracking :class:`~fxpass.rewrite.interpreted.
Interpreter` with handlers for the patterns :mod:`._compile` makes, following
``torch._inductor.pattern_matcher``:

* an op pattern matches a node of its kind calling one of its functions, with exactly as
  many positional arguments and the pattern's keywords (others are ignored); literals are
  equal by ``==`` (lists and tuples alike where the pattern nests), never a node;
* an inner node must have as many users as the pattern gives it (``MULTIPLE``: any); an
  output of the pattern may have any;
* every use of one pattern object meets the same node, every use of one name the same value;
  an ``ExclusiveKeywordArg``'s value is no other exclusive argument's;
* a ``ListOf`` matches each list element apart (bindings of names must agree);
* size checks (:class:`~fxpass.compat.inductor._compile.SizeLeaf`) hold once all is bound.

``relaxed=True`` drops the user counts (an intermediate used outside the match survives for
those users); the patterns themselves then see through views (see :mod:`._compile`).
``explaining=True`` records why an attempt failed (:meth:`MatchState.miss`), for ``explain``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.fx import Node

from ...fxutil.fx_internals import sort_key
from ...rewrite import Match
from ...rewrite.interpreted import Interpreter
from ...rewrite.match import MISSING, MatchState
from ...rewrite.order import find_cycle
from ...rewrite.region import seen_through
from ._compile import Exclusive, Items, OpCall, SizeLeaf
from ._exprs import Ignored

__all__ = ["InductorMatching", "dependent_values", "same", "same_size"]

Cont = Callable[[], bool]


def same(p: Any, v: Any) -> bool:
    """Inductor's literal equality: ``==`` (lists and tuples alike, element-wise); a node
    never equals a literal."""
    if isinstance(p, (list, tuple)):
        return (
            isinstance(v, (list, tuple))
            and len(p) == len(v)
            and all(same(a, b) for a, b in zip(p, v))
        )
    if isinstance(v, (Node, list, tuple)):
        return False
    try:
        return not (v != p)  # noqa: SIM202 - Inductor's test is `!=` (1 == 1.0 == True)
    except Exception:  # broad: values that cannot be compared (tensors) are not the same
        return False


def same_size(have: Any, want: Any) -> bool:
    """Whether the graph's value ``have`` is the size-derived value ``want``. A symbolic
    ``want`` (a dynamic-shape graph) accepts anything, as Inductor's re-traced pattern (its
    symbolic sizes are placeholders) does; so does an ``Ignored`` one (a size of an inner
    value of the pattern, which the trace does not express)."""
    if isinstance(want, Ignored):
        return True
    if isinstance(want, (list, tuple)):
        return (
            isinstance(have, (list, tuple))
            and len(have) == len(want)
            and all(same_size(a, b) for a, b in zip(have, want))
        )
    if isinstance(want, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        kind = {torch.SymInt: "int", torch.SymFloat: "float", torch.SymBool: "bool"}[type(want)]
        constant = getattr(want.node, f"maybe_as_{kind}")()
        if constant is None:
            return True
        want = constant
    return same(want, have)


def _show(v: Any) -> str:
    return f"%{v.name}" if isinstance(v, Node) else repr(v)


class InductorMatching(Interpreter):
    """The interpreter with Inductor's matching rules (see the module docstring)."""

    HANDLERS = {
        **Interpreter.HANDLERS,
        OpCall: "call",
        Exclusive: "exclusive",
        Items: "items",
        SizeLeaf: "size",
    }
    compiled = False

    def __init__(self, *, relaxed: bool = False, explaining: bool = False) -> None:
        super().__init__()
        self.relaxed = relaxed
        self.explaining = explaining
        self.lit_ok = same

    def no(self, st: MatchState, why: Callable[[], str], node: Any = None) -> bool:
        if self.explaining:
            st.miss(why, node)
        return False

    def memo_hit(self, p: Any, v: Any, st: MatchState, k: Cont) -> bool | None:
        prev = st.memo.get(id(p), MISSING)
        if self.explaining and prev is not MISSING and prev is not v and isinstance(v, Node):
            return self.no(st, lambda: f"repeated pattern differs: {_show(prev)} and {_show(v)}", v)
        return super().memo_hit(p, v, st, k)

    def bind(self, p: Any, v: Any, st: MatchState, k: Cont) -> bool:
        if self.explaining and p.name is not None and not p.name.startswith("\x00"):
            prev = st.env.get(p.name, MISSING)
            if prev is not MISSING and prev is not v and (isinstance(v, Node) or not same(prev, v)):
                return self.no(
                    st, lambda: f"kwarg mismatch: {p.name} is {_show(prev)} and {_show(v)}", v
                )
        return super().bind(p, v, st, k)

    # ----- op patterns ------------------------------------------------------------------
    def call(self, p: OpCall, v: Any, st: MatchState, k: Cont) -> bool:
        if p.shared:
            hit = self.memo_hit(p, v, st, k)
            if hit is not None:
                return hit
        if v.__class__ is not Node or not p.calls(v):
            return self.no(
                st, lambda: f"function_mismatch: node={_show(v)}, pattern={p.expr.fns_repr()}", v
            )
        if p.users is not None and not p.output and not self.relaxed and len(v.users) != p.users:
            return self.no(
                st,
                lambda: (
                    f"multiple_users: {_show(v)} has {len(v.users)} users, the pattern gives "
                    f"it {p.users} (only outputs may have others)"
                ),
                v,
            )
        if p.varargs:
            st.nodes.append(v)
            if self.bind(p, v, st, k):
                return True
            st.nodes.pop()
            return False
        vals = p.values(v)
        if vals is None:
            return self.no(
                st,
                lambda: (
                    f"args_structure: {_show(v)} has {len(v.args)} positional arguments and "
                    f"keywords {list(v.kwargs)}; the pattern {p.nargs} and {list(p.kw_names)}"
                ),
                v,
            )
        for i, lit in p.lits:
            if not same(lit, vals[i]):
                return self.no(
                    st, lambda i=i, lit=lit: f"constant_args: {v} {vals[i]!r}!={lit!r}", v
                )
        st.nodes.append(v)
        if self.run(p.subs, vals, st, lambda: self.bind(p, v, st, k)):
            return True
        st.nodes.pop()
        return False

    def exclusive(self, p: Exclusive, v: Any, st: MatchState, k: Cont) -> bool:
        if p.shared:
            hit = self.memo_hit(p, v, st, k)
            if hit is not None:
                return hit
        try:
            owner = st.used.get(v, MISSING)
        except TypeError:  # an unhashable literal: nothing else can hold it
            return super().var(p, v, st, k)
        if owner is not MISSING and owner is not p:
            return self.no(
                st, lambda: f"exclusive arg appears twice: {p.name!r} meets {_show(v)}", v
            )
        if owner is MISSING:
            st.used[v] = p
        if super().var(p, v, st, k):
            return True
        if owner is MISSING:
            del st.used[v]
        return False

    def size(self, p: SizeLeaf, v: Any, st: MatchState, k: Cont) -> bool:
        return self.bind(p, v, st, k)  # checked in final(), once the inputs are bound

    # ----- lists ------------------------------------------------------------------------
    def items(self, p: Items, v: Any, st: MatchState, k: Cont) -> bool:
        if p.shared:
            hit = self.memo_hit(p, v, st, k)
            if hit is not None:
                return hit
        if not isinstance(v, (list, tuple)) or not v:
            return self.no(st, lambda: f"non_list: {_show(v)}", v)
        keep = {
            id(q) for q in p.inner.walk() if isinstance(q, OpCall) and q.expr.has_multiple_users()
        }
        carry = {key: val for key, val in st.memo.items() if key in keep}
        added: list[str] = []
        records: list[dict[str, Any] | None] = []
        mark = len(st.nodes)
        ok = True
        for x in v:
            sub = MatchState(order=st.order)
            sub.env = {n: val for n, val in st.env.items() if not n.startswith("\x00")}
            sub.memo = dict(carry)
            if not self.match(p.inner, x, sub, lambda: True):
                if not p.partial:
                    ok = False
                    break
                records.append(None)
                continue
            carry = {key: val for key, val in sub.memo.items() if key in keep}
            for name, val in sub.env.items():
                if name.startswith("\x00"):
                    continue
                prev = st.env.get(name, MISSING)
                if prev is MISSING:
                    st.env[name] = val
                    added.append(name)
                elif not (prev is val or (not isinstance(val, Node) and same(prev, val))):
                    ok = False
                    break
            if not ok:
                break
            st.nodes.extend(sub.nodes)
            records.append(sub.env)
        if ok and any(r is not None for r in records) and self.bind(p, records, st, k):
            return True
        for name in added:
            del st.env[name]
        del st.nodes[mark:]
        return self.no(st, lambda: f"list: the elements of {_show(v)} do not match {p.inner!r}", v)

    # ----- the whole match --------------------------------------------------------------
    def final(self, rule: Any, st: MatchState) -> bool:
        env = st.env
        for leaf in rule.sizes:
            have = env.get(leaf.name, MISSING)
            if have is MISSING:
                continue
            try:
                want = leaf.fn(env)
            except Exception as e:  # broad: reported — the miss says why (no meta['val'], ...)
                return self.no(st, lambda e=e, leaf=leaf: f"cannot compute {leaf.text}: {e}")
            if not same_size(have, want):
                return self.no(
                    st,
                    lambda want=want, have=have, leaf=leaf: (
                        f"constant_args: {leaf.text} is {want!r} for the matched sizes, the "
                        f"graph has {_show(have)}"
                    ),
                )
        matched = dict.fromkeys(st.nodes)
        outs = list(st.roots) + [env[name] for name in rule.outputs]
        soft = seen_through(st.chains, matched, outs) if st.chains else []
        dropped = _droppable_users(matched, outs, rule.drop_users) if self.relaxed else []
        if len(outs) > 1 or self.relaxed:  # several outputs, or inner nodes used outside
            order = st.order() if callable(st.order) else st.order
            if order is not None:
                hi = max(sort_key(r) for r in st.roots)
                region = set(matched).union(soft)
                via = find_cycle(order, region, hi)
                if via is not None and not self.relaxed and not soft:
                    # by Inductor's rules the replacement reads the bound values alone: a
                    # path back into the match through an argument it ignores (a size
                    # computed from an output, in a dynamic-shape graph) goes with the
                    # match; one to a bound value is a cycle only if the replacement reads
                    # that value, which the entry applying it knows (dependent_values)
                    via = None
                if via is not None:
                    return self.no(
                        st, lambda: f"cycle: replacing it would go through {_show(via)}", via
                    )
        st.found = Match(
            rule=rule,
            root=outs[0],
            bindings=dict(env),
            nodes=list(matched),
            outputs=outs,
            dropped=dropped,
            chains=list(st.chains),
            seen_through=soft,
        )
        return True


def dependent_values(found: Match) -> set[Node]:
    """The values a match binds that are computed from its own nodes (through nodes outside
    it): a replacement reading one would form a cycle."""
    region = set(found.nodes)
    inputs = {v for v in _nodes_in(found.bindings.values()) if v not in region}
    if not inputs or not region:
        return set()
    hi = max(sort_key(n) for n in region)
    stack = [u for n in region for u in n.users if u not in region and sort_key(u) < hi]
    seen: set[Node] = set()
    out: set[Node] = set()
    while stack:
        u = stack.pop()
        if u in seen:
            continue
        seen.add(u)
        if u in inputs:
            out.add(u)
        stack.extend(w for w in u.users if w not in region and sort_key(w) < hi)
    return out


def _nodes_in(values: Any) -> list[Node]:
    out = []
    for v in values:
        if isinstance(v, Node):
            out.append(v)
        elif isinstance(v, (list, tuple)):
            out.extend(_nodes_in(v))
        elif isinstance(v, dict):
            out.extend(_nodes_in(v.values()))
    return out


def _droppable_users(matched: dict, outs: list, drop: frozenset) -> list[Node]:
    """Checks (export's asserts) hanging off inner nodes: with the user counts relaxed they
    no longer block a match, and go with it."""
    out_set = set(outs)
    found = []
    for n in matched:
        if n in out_set or not isinstance(n, Node):
            continue
        for u in n.users:
            if u not in matched and not u.users and u.op == "call_function" and u.target in drop:
                found.append(u)
    return found
