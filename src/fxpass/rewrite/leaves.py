"""The pattern tree's base class and the patterns that are not op calls.

:class:`Pattern` is what every pattern is (its name, location, children, alternatives with
``|``); the leaves are literals (:class:`Lit`), variables (:class:`Var`), literal wildcards
(:class:`Const`), sequences (:class:`Seq`), alternatives (:class:`AnyOf`), values seen
through views and no-op casts (:class:`Through`) and scalars (:class:`Scalar`). The op
pattern ``P`` and the language users write are in :mod:`fxpass.rewrite.pattern`.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator
from typing import Any

from torch.fx import Node

from ..edit.location import caller_location
from ..fxutil.views import keeps_rows
from .constraint import is_noop_cast

__all__ = [
    "AnyOf",
    "Const",
    "Lit",
    "Pattern",
    "Scalar",
    "Seq",
    "Through",
    "Var",
    "as_pattern",
    "mark_shared",
    "walk_children",
]


class Pattern:
    """Base class of all patterns: data that the matchers (:mod:`~fxpass.rewrite.interpreted`,
    :mod:`~fxpass.rewrite.compile`) read."""

    __slots__ = ("_shared", "location", "name")

    RANK = 3  # see fxpass.rewrite.arguments.rank
    LITERAL = False
    free = False  # matches anything and binds nothing: the matchers skip it

    def __init__(self, name: str | None = None, location: str | None = None) -> None:
        self.name = name
        self.location = location or caller_location()
        self._shared = False

    @property
    def shared(self) -> bool:
        """Is this pattern object used more than once in its rule (a DAG, see
        :func:`mark_shared`), so that every use must bind the same node?"""
        return self._shared

    # ----- introspection ----------------------------------------------------------------
    def index_keys(self) -> frozenset | None:
        """Keys (see :func:`~fxpass.rewrite.spelling.node_key`) of the nodes this pattern
        can match; None: any node."""
        return None

    def first_keys(self) -> tuple[frozenset, bool] | None:
        """Keys of the ops this pattern's top node can call (ids for functions), and whether
        any is an op packet; None when it can match anything."""
        return None

    def children(self) -> Iterable[Pattern]:
        return ()

    def walk(self) -> Iterable[Pattern]:
        """This pattern and every pattern inside it, each object once."""
        return walk_children(self)

    def names(self) -> list[str]:
        """Every name this pattern binds, in the order they appear."""
        out: list[str] = []
        for p in self.walk():
            if p.name and p.name not in out:
                out.append(p.name)
        return out

    # ----- building ---------------------------------------------------------------------
    def named(self, name: str) -> Pattern:
        """A copy that binds the matched node (or value) to ``name``."""
        clone = copy.copy(self)
        clone.name = name
        return clone

    def __or__(self, other: Any) -> Pattern:
        return AnyOf([self, as_pattern(other)], location=caller_location())

    def __ror__(self, other: Any) -> Pattern:
        return AnyOf([as_pattern(other), self], location=caller_location())


def as_pattern(x: Any) -> Pattern:
    if isinstance(x, Pattern):
        return x
    if isinstance(x, (list, tuple)) and any(isinstance(e, Pattern) for e in x):
        return Seq(x)
    return Lit(x)


# ----- leaves -----------------------------------------------------------------------------
class Lit(Pattern):
    """A literal argument: equal values match."""

    __slots__ = ("value",)
    RANK = 0
    LITERAL = True

    def __init__(self, value: Any, location: str | None = None) -> None:
        super().__init__(None, location or "")
        self.value = value

    def __repr__(self) -> str:
        return repr(self.value)


class Var(Pattern):
    """Any value (node or literal), bound to ``name``; optional constraints on its meta."""

    __slots__ = ("constraint", "node_only")

    def __init__(self, name=None, *, constraint=None, node_only=False, location=None) -> None:
        super().__init__(name, location)
        self.constraint = constraint if constraint else None
        self.node_only = node_only

    @property
    def free(self) -> bool:
        return self.name is None and self.constraint is None and not self.node_only

    def __repr__(self) -> str:
        return self.name or "_"


class Const(Pattern):
    """Any literal (not a node) of the given types, bound to ``name``: e.g. ``eps``."""

    __slots__ = ("types", "where")

    def __init__(self, name=None, types=None, *, where=None, location=None) -> None:
        super().__init__(name, location)
        if isinstance(types, type):
            types = (types,)
        self.types = tuple(types) if types else None
        self.where = where

    def __repr__(self) -> str:
        return f"const({self.name or ''})"


class Seq(Pattern):
    """A list or tuple argument whose elements are patterns (e.g. ``cat([a, b])``)."""

    __slots__ = ("items",)
    RANK = 2

    def __init__(self, items: Iterable[Any], location: str | None = None) -> None:
        super().__init__(None, location or "")
        self.items = [as_pattern(i) for i in items]

    def children(self):
        return self.items

    def __repr__(self) -> str:
        return "[" + ", ".join(map(repr, self.items)) + "]"


class AnyOf(Pattern):
    """Alternatives, tried in order; a later one is tried when the rest of the match fails."""

    __slots__ = ("options",)
    RANK = 2

    def __init__(self, options: Iterable[Any], *, name=None, location=None) -> None:
        super().__init__(name, location)
        opts: list[Pattern] = []
        for o in options:
            o = as_pattern(o)
            if isinstance(o, AnyOf) and o.name is None:
                opts.extend(o.options)
            else:
                opts.append(o)
        self.options = opts

    def children(self):
        return self.options

    def index_keys(self):
        keys: set = set()
        for o in self.options:
            ks = o.index_keys()
            if ks is None:
                return None
            keys |= ks
        return frozenset(keys)

    def first_keys(self):
        keys, packets = set(), False
        for o in self.options:
            sub = o.first_keys()
            if sub is None:
                return None
            keys |= sub[0]
            packets |= sub[1]
        return frozenset(keys), packets

    def __repr__(self) -> str:
        return "(" + " | ".join(map(repr, self.options)) + ")"


# ----- seeing through ops that keep the values ----------------------------------------------
class Through(Pattern):
    """``inner`` at the value, or at the value behind a chain of ops that leave each of its
    rows (its values along the last dimension) as they are: shape-only ops that keep the
    last dimension (``views``) and casts to the dtype a value already has (``casts``).

    The chain's nodes are not part of the match: they stay in the graph (reading whatever
    replaces what they read) and go when nothing uses them any more. A chain that starts at
    an inner node of the match must be used only inside it, like any inner node. When a
    replacement's value has the shape of the chain's input where the replaced node had the
    shape of its output, the rewriter replays the chain on it (see :meth:`P.through`).
    """

    __slots__ = ("casts", "inner", "views")
    MAX_CHAIN = 16  # a longer run of views between two ops is no spelling anyone writes

    def __init__(self, inner: Any, *, views: bool, casts: bool, location=None) -> None:
        super().__init__(None, location)
        self.inner = as_pattern(inner)
        self.views = views
        self.casts = casts

    def children(self):
        return [self.inner]

    def step(self, v: Any) -> Node | None:
        """The input of ``v`` when ``v`` is an op this pattern sees through, else None."""
        if v.__class__ is not Node or v.op not in ("call_function", "call_method"):
            return None
        src = v.args[0] if v.args else None
        if src.__class__ is not Node:
            return None
        if self.casts and is_noop_cast(v):
            return src
        if self.views and keeps_rows(v):
            return src
        return None

    def __repr__(self) -> str:
        what = "+".join(w for w, on in (("views", self.views), ("casts", self.casts)) if on)
        text = f"through[{what}]({self.inner!r})"
        return f"{text}.named({self.name!r})" if self.name else text


class Scalar(Pattern):
    """A number: a literal, or a one-element constant tensor standing for one (ExecuTorch's
    Edge programs lift ``x + 1e-6`` into ``x + _lifted_tensor_constant``). Binds the number."""

    __slots__ = ("types",)

    def __init__(self, name=None, types=None, *, location=None) -> None:
        super().__init__(name, location)
        if isinstance(types, type):
            types = (types,)
        self.types = tuple(types) if types else (int, float)

    def __repr__(self) -> str:
        return f"scalar({self.name or ''})"


def mark_shared(roots: Iterable[Pattern]) -> None:
    """Flag every pattern object used more than once (a DAG), so all uses bind one node."""
    counts: dict[int, int] = {}
    objs: dict[int, Pattern] = {}
    stack = list(roots)
    while stack:
        p = stack.pop()
        counts[id(p)] = counts.get(id(p), 0) + 1
        if counts[id(p)] == 1:
            objs[id(p)] = p
            stack.extend(p.children())
    for key, n in counts.items():
        p = objs[key]
        if n > 1 and not isinstance(p, Lit):
            p._shared = True


def walk_children(root: Any) -> Iterator[Any]:
    """``root`` and everything under it by ``children()``, each object once, depth first in
    the children's order (a pattern DAG, or any tree of objects with ``children()``)."""
    seen: set[int] = set()
    stack = [root]
    while stack:
        p = stack.pop()
        if id(p) in seen:
            continue
        seen.add(id(p))
        yield p
        stack.extend(reversed(list(p.children())))
