"""An op pattern's arguments laid out against the schema of the op a node calls.

For ATen ops the arguments are compared by the op's schema: keyword or positional spelling
does not matter, and arguments the pattern leaves out must hold their defaults. The layout
of each (pattern, target) pair is computed once and cached on the pattern; a generated
``getter(args, kwargs)`` then fetches the node's value for every argument the pattern
mentions. :func:`rank` orders sibling sub-patterns for both matchers (the interpreter in
:mod:`~fxpass.rewrite.interpreted`, the generated code in :mod:`~fxpass.rewrite.compile`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..fxutil.dialect import aten_op
from ..fxutil.ops import schema_of
from ._state import MISSING
from .spelling import OpOverload

__all__ = ["Layout", "layout", "rank"]


def rank(p: Any) -> int:
    """When a sub-pattern is tried among its siblings (lowest first): literals, then op
    patterns (they fail fastest), then sequences and alternatives, then the rest. Each
    pattern class states its own (``RANK``); both matchers sort by it, ties in slot order."""
    return p.RANK


class Layout:
    """An op pattern's arguments resolved against one target's schema.

    ``getter(args, kwargs)`` (generated code) returns the node's value for every argument
    the pattern mentions, in ``slots`` order; the first two are the first two positional
    parameters when the pattern is commutative.
    """

    __slots__ = (
        "child_slot",
        "free",
        "getter",
        "kw_names",
        "lits",
        "ok",
        "pos_limit",
        "quick",
        "slots",
        "subs",
        "swap",
        "unmentioned",
    )

    def __init__(self) -> None:
        self.slots: list[tuple] = []  # (index, name, default, pattern)
        self.lits: list[tuple] = []  # (slot, literal)
        self.subs: list[tuple] = []  # (slot, pattern), by rank
        self.quick: list[tuple] = []  # (slot, first-op keys, packets) checked up front
        self.unmentioned: list[tuple] = []  # (index, name, default) that must equal default
        self.pos_limit = -1  # schema-less targets: the positional args the pattern gives
        self.kw_names: frozenset[str] = frozenset()  # schema-less: the kwargs it gives
        self.free = False  # schema-less: the node may have more arguments
        self.swap: tuple[int, int] | None = None  # slots of positional 0 and 1
        self.ok = True
        self.getter: Callable[[tuple, dict], list] = lambda a, kw: []
        self.child_slot: list[int] = []  # for each pattern argument, its slot

    def finish(self, children: list[Any]) -> None:
        slots = self.slots
        where = {s[0]: i for i, s in enumerate(slots) if s[0] >= 0}
        if 0 in where and 1 in where:
            self.swap = (where[0], where[1])
        subs = []
        for i, (_, _, _, p) in enumerate(slots):
            if p.LITERAL:
                self.lits.append((i, p.value))
            elif not p.free:
                subs.append((i, p))
        subs.sort(key=lambda s: rank(s[1]))
        self.subs = subs
        for i, p in subs:
            keys = p.first_keys()
            if keys is not None:
                self.quick.append((i, keys[0], keys[1]))
        self.getter = _make_getter(slots)
        used: set[int] = set()
        for child in children:
            i = next(i for i, sl in enumerate(slots) if sl[3] is child and i not in used)
            used.add(i)
            self.child_slot.append(i)


def layout(p: Any, target: Any, eager: bool = False) -> Layout:
    """The argument layout of op pattern ``p`` for ``target`` (a call_function target, or
    an op name); ``eager``: raise on a pattern that cannot fit the schema."""
    r = Layout()
    spelled = isinstance(target, OpOverload) or aten_op(target) is not target
    schema = schema_of(target) if spelled else None
    if schema is not None:
        _by_schema(p, r, schema, target, eager)
    else:
        for i, a in enumerate(p.args):
            r.slots.append((i, None, MISSING, a))
        for name, a in p.kwargs.items():
            r.slots.append((-1, name, MISSING, a))
        r.pos_limit = len(p.args)
        r.kw_names = frozenset(p.kwargs)
        r.free = p.free_rest
    if r.ok:
        r.finish(list(p.children()))
    return r


def _by_schema(p: Any, r: Layout, schema: Any, target: Any, eager: bool) -> None:
    params = schema.arguments
    positional = [a for a in params if not a.kwarg_only]
    if len(p.args) > len(positional):
        if eager:
            raise TypeError(
                f"pattern {target} gets {len(p.args)} positional arguments, but the op "
                f"takes at most {len(positional)} ({schema})"
            )
        r.ok = False
        return
    given = {}
    for i, a in enumerate(p.args):
        given[positional[i].name] = a
    for key, a in p.kwargs.items():
        if key in given or not any(x.name == key for x in params):
            if eager:
                raise TypeError(f"pattern {target} has no argument '{key}' ({schema})")
            r.ok = False
            return
        given[key] = a
    for idx, a in enumerate(params):
        index = -1 if a.kwarg_only else idx
        default = a.default_value if a.has_default_value() else MISSING
        if a.name in given:
            r.slots.append((index, a.name, default, given[a.name]))
        elif p.free_rest:
            continue
        elif default is MISSING:
            if eager:
                raise TypeError(
                    f"pattern {target} gives no value for its required argument "
                    f"'{a.name}'; add it, or end the arguments with '...' to leave "
                    f"the rest free ({schema})"
                )
            r.ok = False
            return
        else:
            r.unmentioned.append((index, a.name, default))


def _make_getter(slots: list[tuple]) -> Callable[[tuple, dict], list]:
    """Generated code fetching each slot's value from a node's args and kwargs."""
    env: dict[str, Any] = {}
    parts = []
    for j, (index, name, default, _) in enumerate(slots):
        env[f"d{j}"] = default
        if index >= 0 and name is not None:
            parts.append(f"a[{index}] if n > {index} else kw.get({name!r}, d{j})")
        elif index >= 0:
            parts.append(f"a[{index}] if n > {index} else d{j}")
        else:
            parts.append(f"kw.get({name!r}, d{j})")
    src = "def getter(a, kw):\n    n = len(a)\n    return [" + ", ".join(parts) + "]\n"
    exec(compile(src, "<fxpass pattern arguments>", "exec"), env)
    return env["getter"]
