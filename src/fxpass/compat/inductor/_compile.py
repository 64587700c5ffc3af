"""Inductor patterns as fxpass patterns: each pattern expression is translated once.

A ``CallFunction`` becomes an :class:`OpCall` (an fxpass op pattern that keeps Inductor's
argument rules and the number of users the node must have), a ``KeywordArg`` a variable of
that name, ``Arg`` and every op pattern a variable under a hidden name (so a match binds the
node of every pattern expression, from which :mod:`._match` rebuilds Inductor's ``args``,
``kwargs`` and ``nodes``), a ``MultiOutputPattern`` a multi-root :class:`~fxpass.rewrite.Rule`
whose inner outputs are the rule's outputs. The result is matched by
:class:`~fxpass.compat.inductor._matching.InductorMatching`.

With ``relaxed=True`` (the opt-in improvements) an op pattern's op arguments are seen
through views, reshapes and no-op casts (:meth:`P.through <fxpass.rewrite.P.through>`), and
intermediates may have users outside the match.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.fx import Node

from ...core.errors import FxpassError
from ...edit.editor import Editor
from ...fxutil.ops import schema_of
from ...rewrite import GraphReplacement, Rule
from ...rewrite.leaves import AnyOf, Pattern, Seq, Through, Var
from ...rewrite.pattern import P as _P
from ._exprs import (
    Arg,
    ExclusiveKeywordArg,
    Ignored,
    KeywordArg,
    ListOf,
    MultiOutputPattern,
    Multiple,
    PatternExpr,
    RepeatedExpr,
    SizeExpr,
    _TargetArgsExpr,
    _TargetExpr,
    _TargetExprVarArgs,
    walk,
)

__all__ = [
    "Compiled",
    "FunctionalizedV2",
    "argument_values",
    "Exclusive",
    "InductorRule",
    "Items",
    "OpCall",
    "PatternError",
    "SizeLeaf",
    "compile_pattern",
    "leaf",
]

_hidden = itertools.count()


class PatternError(FxpassError):
    """A pattern expression that can never match (or cannot be translated)."""


def _name() -> str:
    return f"\x00{next(_hidden)}"  # never a parameter name: a hidden binding


def leaf(v: Any) -> bool:
    """Inductor flattens nested arguments as pytrees: a pattern leaf meets a list there."""
    return not isinstance(v, (list, tuple, dict))


class OpCall(_P):
    """A node of ``kind`` (call_function/method/module) calling one of the expression's
    ``fns``, with Inductor's argument rules: exactly as many positional arguments, the
    pattern's keywords present in its order (others ignored), ``users`` users unless it is
    an output or ``users`` is None (``MULTIPLE``); ``varargs``: any arguments."""

    __slots__ = (
        "expr",
        "ids",
        "kind",
        "kw_names",
        "lits",
        "nargs",
        "output",
        "slots",
        "subs",
        "users",
        "varargs",
    )

    def __init__(self, expr: _TargetExpr, name: str) -> None:
        Pattern.__init__(self, name, "")
        fns = [f for f in expr.fns if not isinstance(f, str)]
        self.fns = frozenset(f for f in fns if not isinstance(f, torch._ops.OpOverloadPacket))
        self.packets = frozenset(f for f in fns if isinstance(f, torch._ops.OpOverloadPacket))
        self.methods = frozenset(f for f in expr.fns if isinstance(f, str))
        self.fn_ids = frozenset(id(f) for f in fns)
        self.modules = frozenset()
        self.free_rest = True
        self.args, self.kwargs = [], {}
        self.commutative = False
        self.constraint = None
        self.label = None
        self.one_spelling = True
        self._cache, self._keep = {}, list(fns)
        self.expr = expr
        self.kind = expr.op
        self.ids = self.fn_ids
        self.users = None if isinstance(expr.users, Multiple) else expr.users
        self.output = False
        self.varargs = isinstance(expr, _TargetExprVarArgs)
        self.nargs = len(expr.args) if not self.varargs else -1
        self.kw_names = tuple(expr.kwargs) if not self.varargs else ()
        self.slots: list[Any] = []  # per value: a pattern, or a literal
        self.lits: list[tuple[int, Any]] = []
        self.subs: list[tuple[int, Pattern]] = []

    def calls(self, v: Node) -> bool:
        """Whether ``v`` is a node of this kind calling one of the functions."""
        if v.op != self.kind:
            return False
        if self.kind == "call_function":
            return id(v.target) in self.ids
        if self.kind == "call_method":
            return v.target in self.methods
        owner = v.graph.owning_module
        mod = owner.get_submodule(v.target) if owner is not None else None
        return type(mod) in self.expr.fns_set

    def values(self, v: Node) -> list[Any] | None:
        """The node's argument values in the pattern's order (:func:`argument_values`)."""
        return argument_values(v, self.nargs, self.kw_names)

    def finish(self) -> None:
        """Split the slots into literals and sub-patterns (after sharing is known)."""
        self.lits = [(i, s) for i, s in enumerate(self.slots) if not isinstance(s, Pattern)]
        subs = [
            (i, s)
            for i, s in enumerate(self.slots)
            if isinstance(s, Pattern) and not (s.free and not s.shared)
        ]
        # op patterns first: they fail fastest (the order of checks changes no result)
        subs.sort(key=lambda sub: 1 if isinstance(sub[1], (OpCall, Through)) else sub[1].RANK)
        self.subs = subs
        self.args = [s for s in self.slots if isinstance(s, Pattern)]

    def children(self):
        return self.args

    def __repr__(self) -> str:
        return repr(self.expr)


class FunctionalizedV2(OpCall):
    """With the improvements: an ``auto_functionalized(op, **kwargs)`` pattern (how vLLM
    writes a mutating custom op) also matches the ``auto_functionalized_v2`` node that
    functionalization makes by default — each mutated argument read from ``_all_bases``
    at its own position (no views), so the results are indexed as in the pattern."""

    __slots__ = ("mutated",)

    def __init__(self, expr: _TargetExpr, name: str | None, op: Any) -> None:
        super().__init__(expr, name)
        v2 = torch.ops.higher_order.auto_functionalized_v2
        self.fns, self.packets, self.fn_ids = frozenset([v2]), frozenset(), frozenset([id(v2)])
        self.ids = self.fn_ids
        self._keep = [v2]
        schema = schema_of(op)
        self.mutated = [
            a.name
            for a in (schema.arguments if schema is not None else ())
            if a.alias_info is not None and a.alias_info.is_write
        ]

    def calls(self, v: Node) -> bool:
        return v.op == "call_function" and id(v.target) in self.ids

    def values(self, v: Node) -> list[Any] | None:
        if len(v.args) != 1:
            return None
        kwargs = v.kwargs
        bases = kwargs.get("_all_bases")
        if not isinstance(bases, (list, tuple)) or len(bases) != len(self.mutated):
            return None
        out: list[Any] = [v.args[0]]
        for name in self.kw_names:
            if name in self.mutated:
                i = self.mutated.index(name)
                if kwargs.get(f"_{name}_base_index") != i or any(
                    f"_{name}_{key}" in kwargs for key in _VIEW_KEYS
                ):
                    return None
                out.append(bases[i])
            elif name in kwargs:
                out.append(kwargs[name])
            else:
                return None
        return out


_VIEW_KEYS = ("size", "stride", "storage_offset", "slice_dim", "slice_start", "slice_end", "alias")


def argument_values(v: Node, nargs: int, names: tuple[str, ...]) -> list[Any] | None:
    """``v``'s positional arguments then its keywords ``names``, or None when it has not
    ``nargs`` positional arguments or lacks those keywords (Inductor normalizes against the
    schema when keywords are missing; other keywords are ignored)."""
    args, kwargs = v.args, v.kwargs
    if len(args) != nargs:
        return None
    if not names:
        return list(args)
    if len(kwargs) < len(names):
        normalized = _normalize(v)
        if normalized is None:
            return None
        args, kwargs = normalized
        if len(args) != nargs:
            return None
    if [k for k in kwargs if k in names] != list(names):
        return None
    return [*args, *(kwargs[k] for k in names)]


def _normalize(v: Node) -> tuple[tuple, dict] | None:
    from torch.fx.operator_schemas import normalize_function

    try:
        pair = normalize_function(v.target, v.args, v.kwargs)
    except Exception:  # broad: arguments no schema of the op takes match no argument list
        return None
    return None if pair is None else (tuple(pair.args), dict(pair.kwargs))


class Exclusive(Var):
    """An ``ExclusiveKeywordArg``: no other exclusive argument of the match may bind its value."""


class Items(Pattern):
    """A ``ListOf``: every element of a list (``partial``: at least one) matches ``inner``;
    what each element bound is kept apart, as Inductor bundles it."""

    __slots__ = ("inner", "partial")
    RANK = 2

    def __init__(self, inner: Pattern, partial: bool, name: str) -> None:
        super().__init__(name, "")
        self.inner = inner
        self.partial = partial

    def children(self):
        return [self.inner]

    def __repr__(self) -> str:
        return f"ListOf({self.inner!r})"


class SizeLeaf(Pattern):
    """A value computed from the inputs' sizes (:class:`SizeExpr`); checked once the whole
    pattern has matched (the inputs are bound by then)."""

    __slots__ = ("fn", "text")
    RANK = 4

    def __init__(self, expr: SizeExpr, name: str) -> None:
        super().__init__(name, "")
        self.fn = expr.fn
        self.text = expr.text

    def __repr__(self) -> str:
        return self.text


class InductorRule(Rule):
    """The rule of a pattern expression; ``sizes`` are its size checks (made by tracing)."""

    sizes: tuple[SizeLeaf, ...] = ()


@dataclass
class Compiled:
    """A pattern expression as an fxpass rule, and how to read a match of it back."""

    expr: PatternExpr
    rule: Rule
    names: dict[int, str]  # id(expression) -> the name its match is bound to
    outputs: list[PatternExpr | None]
    sizes: list[SizeLeaf] = field(default_factory=list)
    relaxed: bool = False
    multi_user: set[int] = field(default_factory=set)  # ids of expressions with many users
    #: why the pattern can never match (Inductor's words), else None: an output of a
    #: MultiOutputPattern that shares nothing with the outputs before it
    unanchored: str | None = None


def _no_anchor(output: Any) -> str:
    text = repr(output)
    text = text if len(text) <= 80 else text[:77] + "..."
    return (
        f"no anchor found: output {text} shares no node and no argument with the outputs before it"
    )


class _NoReplacement(GraphReplacement):
    """The rule's replacement until an entry applies a match (see :mod:`._replay`)."""

    def write(self, match: Any, bindings: dict[str, Any], editor: Editor) -> Any:
        raise PatternError("this pattern has no replacement of its own")


def compile_pattern(expr: PatternExpr, *, relaxed: bool = False) -> Compiled:
    """The fxpass rule for ``expr`` (cached on it; patterns are not changed once used)."""
    cache = expr.__dict__.get("_fxpass_compiled")
    if cache is None:
        cache = expr.__dict__["_fxpass_compiled"] = {}
    hit = cache.get(relaxed)
    if hit is None:
        hit = cache[relaxed] = _Translator(relaxed).compile(expr)
    return hit


class _Translator:
    def __init__(self, relaxed: bool) -> None:
        self.relaxed = relaxed
        self.memo: dict[Any, Pattern] = {}
        self.names: dict[int, str] = {}
        self.calls: list[OpCall] = []
        self.sizes: list[SizeLeaf] = []

    def compile(self, expr: PatternExpr) -> Compiled:
        outputs = list(expr.outputs) if isinstance(expr, MultiOutputPattern) else [expr]
        pats = [self.pattern(e) if e is not None else None for e in outputs]
        for p in pats:
            for q in p.options if isinstance(p, AnyOf) else [p]:
                if isinstance(q, OpCall):
                    q.output = True
        roots: list[Pattern] = []
        inner: list[str] = []
        # Inductor finds each later output from the nodes the ones before it matched
        # (``find_anchor_nodes``); one that shares no node and no argument with them has no
        # anchor: the pattern registers and never matches
        unanchored = None
        for e, p in zip(outputs, pats):
            if p is None:
                continue
            seen = {id(q) for r in roots for q in r.walk()}
            bound = {n for r in roots for n in r.names()}
            if roots and (id(p) in seen or (p.name is not None and p.name in bound)):
                inner.append(p.name)
            elif isinstance(p, (OpCall, AnyOf)):
                roots.append(p)
            elif roots:  # an argument no output before it reads
                unanchored = unanchored or _no_anchor(e)
            else:
                raise PatternError(
                    f"the first output of a MultiOutputPattern must be an op pattern, got {e!r}"
                )
        rule, unanchored = self._rule(expr, roots, inner, unanchored)
        rule.sizes = tuple(self.sizes)
        for c in self.calls:
            c.finish()
        multi_user = {id(e) for e in walk(expr) if e.has_multiple_users()}
        return Compiled(
            expr, rule, self.names, outputs, self.sizes, self.relaxed, multi_user, unanchored
        )

    def _rule(
        self, expr: PatternExpr, roots: list[Pattern], inner: list[str], unanchored: str | None
    ) -> tuple[InductorRule, str | None]:
        """The rule of ``roots``; where a root shares nothing with the ones before it, the
        rule of the roots before it, and why the pattern never matches."""
        name = type(expr).__name__
        for k in range(len(roots), 0, -1):
            bound = {n for r in roots[:k] for n in r.names()}
            try:
                rule = InductorRule(
                    tuple(roots[:k]),
                    _NoReplacement(),
                    name=name,
                    outputs=[n for n in inner if n in bound],
                    contained=False,
                    location="",
                )
            except ValueError:
                continue
            if k < len(roots):
                unanchored = _no_anchor(roots[k].expr if isinstance(roots[k], OpCall) else roots[k])
            return rule, unanchored
        raise AssertionError("a rule of one root always links")

    def pattern(self, e: Any, *, nested: bool = False) -> Pattern:
        key = (id(e), nested and isinstance(e, (Arg, Ignored, KeywordArg, ExclusiveKeywordArg)))
        hit = self.memo.get(key)
        if hit is not None:
            return hit
        p = self._make(e, nested)
        self.memo[key] = p
        if p.name is not None:
            self.names.setdefault(id(e), p.name)
        return p

    def _make(self, e: Any, nested: bool) -> Pattern:
        where: Callable[[Any], bool] | None = leaf if nested else None
        constraint = _Where(where) if where is not None else None
        if isinstance(e, KeywordArg):
            return Var(e.name, constraint=constraint, location="")
        if isinstance(e, ExclusiveKeywordArg):
            return Exclusive(e.name, constraint=constraint, location="")
        if isinstance(e, Arg):  # a nested use binds the same hidden name
            return Var(self.names.get(id(e)) or _name(), constraint=constraint, location="")
        if isinstance(e, Ignored):
            return Var(None, constraint=constraint, location="")
        if isinstance(e, SizeExpr):
            leaf_ = SizeLeaf(e, _name())
            self.sizes.append(leaf_)
            return leaf_
        if isinstance(e, ListOf):
            return Items(self.pattern(e.pattern), e.partial, _name())
        if isinstance(e, _TargetExpr):
            return self._call(e)
        if isinstance(e, RepeatedExpr):
            raise PatternError(
                "RepeatedExpr patterns are not supported by fxpass.compat.inductor (Inductor "
                "uses them for its own split/cat passes, which keep Inductor's matcher)"
            )
        if isinstance(e, MultiOutputPattern):
            raise PatternError(
                "a MultiOutputPattern may only be the whole pattern, not part of one"
            )
        raise PatternError(f"not a pattern expression: {e!r}")

    def _call(self, e: _TargetExpr) -> Pattern:
        functionalized = (
            self.relaxed
            and isinstance(e, _TargetArgsExpr)
            and e.fns == [torch.ops.higher_order.auto_functionalized]
            and len(e.args) == 1
        )
        p = OpCall(e, None if functionalized else _name())
        self.calls.append(p)
        if isinstance(e, _TargetArgsExpr):
            values = [*e.args, *e.kwargs.values()]
            p.slots = [self.argument(a, e.nested) for a in values]
            p.args = [s for s in p.slots if isinstance(s, Pattern)]
        if not functionalized:
            return p
        v2 = FunctionalizedV2(e, None, e.args[0])
        v2.slots, v2.args = p.slots, p.args
        self.calls.append(v2)
        return AnyOf([p, v2], name=_name(), location="")

    def argument(self, a: Any, nested: bool) -> Any:
        if isinstance(a, PatternExpr):
            p = self.pattern(a, nested=nested)
            if self.relaxed and isinstance(p, (OpCall, AnyOf)):
                return Through(p, views=True, casts=True, location="")
            return p
        if nested and isinstance(a, (list, tuple)) and _has_pattern(a):
            return Seq([self.argument(x, True) for x in a], location="")
        return a


def _has_pattern(a: Any) -> bool:
    if isinstance(a, (list, tuple)):
        return any(_has_pattern(x) for x in a)
    return isinstance(a, PatternExpr)


class _Where:
    """A constraint on a variable's value (duck-typed :class:`~fxpass.rewrite.constraint.
    Constraint`): the pytree-leaf rule of nested arguments."""

    __slots__ = ("where",)

    def __init__(self, where: Callable[[Any], bool]) -> None:
        self.where = where

    def __bool__(self) -> bool:
        return True

    def failure(self, v: Any, what: Any = None) -> str | None:
        return None if self.where(v) else f"a list where the pattern has one value ({v!r})"
