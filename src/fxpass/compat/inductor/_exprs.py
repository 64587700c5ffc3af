"""Inductor's pattern expressions (``CallFunction``, ``KeywordArg``, ...), as data.

The classes take the arguments and carry the attributes of ``torch._inductor.pattern_matcher``'s
(``fns``, ``args``, ``kwargs``, ``users``, ``op``, ``outputs``...), print the same way and compare
with ``pattern_eq``. They do not match anything themselves: :mod:`._compile` turns a pattern
into fxpass patterns once, and fxpass's matcher (with Inductor's rules,
:mod:`._matching`) finds it. ``pattern.match(node)`` is there for code that calls it.

>>> from torch.fx.experimental.proxy_tensor import make_fx
>>> gm = make_fx(lambda a, b: a + b.sin())(torch.randn(2), torch.randn(2))
>>> add = list(gm.graph.nodes)[-2]
>>> aten = torch.ops.aten
>>> pattern = CallFunction(aten.add.Tensor, KeywordArg("x"), CallFunction(aten.sin.default, Arg()))
>>> pattern.match(add)           # a Match, or a FailedMatch (which is falsy)
Match(..., [b_1], {'x': a_1})
>>> bool(pattern.match(add.args[1]))
False
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch.fx import Node

from ...rewrite.leaves import walk_children

__all__ = [
    "MULTIPLE",
    "Arg",
    "CallFunction",
    "CallFunctionVarArgs",
    "CallMethod",
    "CallMethodVarArgs",
    "CallModule",
    "CallModuleVarArgs",
    "ExclusiveKeywordArg",
    "FailedMatch",
    "Ignored",
    "KeywordArg",
    "ListOf",
    "Multiple",
    "MultiOutputPattern",
    "PatternExpr",
    "RepeatedExpr",
    "SizeExpr",
]


#: How ``PatternExpr.match`` matches: set by :mod:`._entry` (which imports this module).
MATCHER: list[Callable[[Any, Node], Any]] = []


class Multiple:
    """The type of :data:`MULTIPLE`: an op pattern whose node may have any number of users."""

    def __repr__(self) -> str:
        return "MULTIPLE"


MULTIPLE = Multiple()


class FailedMatch(RuntimeError):
    """Why a pattern did not match (falsy), as Inductor's ``FailedMatch``."""

    def __init__(self, format_string: str, *args: Any, **kwargs: Any) -> None:
        self.format_string = format_string
        self.args = args
        self.kwargs = kwargs

    def __str__(self) -> str:
        return self.format_string.format(*self.args, **self.kwargs)

    def __bool__(self) -> bool:
        return False


class PatternExpr:
    """Base class of the pattern expressions."""

    def match(self, node: Node) -> Any:
        """The :class:`~fxpass.compat.inductor.Match` of this pattern rooted at ``node``, or
        a :class:`FailedMatch` saying why not (Inductor's matching rules)."""
        return MATCHER[0](self, node)

    def has_multiple_users(self) -> bool:
        return False

    def children(self) -> Iterator[PatternExpr]:
        """The sub-patterns, in the order Inductor matches them."""
        return iter(())

    def pattern_eq(self, other: Any) -> bool:
        """Whether ``other`` has the same structure (not a match: a comparison of patterns)."""
        return isinstance(other, self.__class__)

    def pretty_print(self, pp: Any) -> str:
        return repr(self)

    def __repr__(self) -> str:
        return self.__class__.__name__ + "()"


class Arg(PatternExpr):
    """Matches anything; the value becomes the next positional argument of the handler."""


class Ignored(PatternExpr):
    """Matches anything; the value is not passed on."""

    def __repr__(self) -> str:
        return "*"

    def pretty_print(self, pp: Any) -> str:
        return "Ignored()"


class KeywordArg(PatternExpr):
    """Matches anything; the value becomes keyword argument ``name`` of the handler (every
    occurrence of a name must see the same value)."""

    def __init__(self, name: str) -> None:
        if not isinstance(name, str):
            raise TypeError(f"KeywordArg(name): name must be a str, got {name!r}")
        self.name = name

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({self.name!r})"

    def pattern_eq(self, other: Any) -> bool:
        return super().pattern_eq(other) and self.name == other.name


class ExclusiveKeywordArg(PatternExpr):
    """Like :class:`KeywordArg`, but no other exclusive argument of the match may see the
    same value."""

    def __init__(self, name: str) -> None:
        if not isinstance(name, str):
            raise TypeError(f"ExclusiveKeywordArg(name): name must be a str, got {name!r}")
        self.name = name

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({self.name!r})"

    def pattern_eq(self, other: Any) -> bool:
        return super().pattern_eq(other) and self.name == other.name


def _expand(fns: Any) -> list[Any]:
    fns = [fns] if callable(fns) or isinstance(fns, str) else list(fns)
    out = list(fns)
    for fn in fns:
        if isinstance(fn, torch._ops.OpOverloadPacket):
            out.extend(fn.op_overloads())
    return out


class _TargetExpr(PatternExpr):
    """A node calling one of ``fns``, with ``users`` users (an int, or :data:`MULTIPLE`)."""

    op = ""

    def __init__(self, fns: Any, users: Multiple | int = 1) -> None:
        self.fns = _expand(fns)
        if not self.fns:
            raise ValueError(f"{type(self).__name__}: give at least one function or op")
        self.fns_set = set(self.fns)
        self.users = users

    def has_multiple_users(self) -> bool:
        return isinstance(self.users, Multiple) or self.users > 1

    def fns_repr(self) -> str:
        first = self.fns[0]
        name = first if isinstance(first, str) else getattr(first, "__name__", repr(first))
        if len(self.fns) > 1:
            return f"[{name}, ...]"
        if first is getattr(torch, name, None):
            return f"torch.{name}"
        if first is getattr(operator, name, None):
            return f"operator.{name}"
        if isinstance(first, torch._ops.OpOverload):
            return str(first)
        return name

    def _users_text(self) -> list[str]:
        if self.users is MULTIPLE:
            return ["_users=MULTIPLE"]
        return [] if self.users == 1 else [f"_users={self.users}"]

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({', '.join([self.fns_repr(), *self._users_text()])})"

    def pattern_eq(self, other: Any) -> bool:
        return (
            super().pattern_eq(other)
            and self.op == other.op
            and self.fns == other.fns
            and self.users == other.users
        )


class _TargetArgsExpr(_TargetExpr):
    """A node calling one of ``fns`` with arguments matching ``args`` and ``kwargs``."""

    def __init__(self, fns: Any, *args: Any, _users: Multiple | int = 1, **kwargs: Any) -> None:
        super().__init__(fns, _users)
        self.args = tuple(args)
        self.kwargs = dict(kwargs)
        #: Inductor compares nested arguments as pytrees (lists and tuples alike), flat ones
        #: as they are; which one depends on whether the pattern nests.
        self.nested = any(isinstance(x, (dict, list, tuple)) for x in (*args, *kwargs.values()))

    @property
    def flat_args_kwargs(self) -> tuple[list[Any], Any]:
        """The arguments flattened (lists and tuples opened), and their structure."""
        flat: list[Any] = []
        spec = (_flatten(self.args, flat), tuple(self.kwargs))
        for v in self.kwargs.values():
            _flatten(v, flat)
        return flat, spec

    def children(self) -> Iterator[PatternExpr]:
        kids = self.__dict__.get("_children")
        if kids is None:  # a pattern's arguments do not change once it is used
            kids = self.__dict__["_children"] = [
                x for x in self.flat_args_kwargs[0] if isinstance(x, PatternExpr)
            ]
        return iter(kids)

    def __repr__(self) -> str:
        parts = [self.fns_repr(), *map(repr, self.args)]
        parts += [f"{k}={v}" for k, v in self.kwargs.items()]
        return f"{self.__class__.__name__}({', '.join(parts + self._users_text())})"

    def pretty_print(self, pp: Any) -> str:
        parts = [self.fns_repr(), *(pp.pretty_print(x) for x in self.args)]
        parts += [f"{k}={pp.pretty_print(v)}" for k, v in self.kwargs.items()]
        return f"{self.__class__.__name__}({', '.join(parts + self._users_text())})"

    def pattern_eq(self, other: Any) -> bool:
        if not super().pattern_eq(other):
            return False
        mine, spec = self.flat_args_kwargs
        theirs, other_spec = other.flat_args_kwargs
        return spec == other_spec and all(
            a.pattern_eq(b) if isinstance(a, PatternExpr) else a == b for a, b in zip(mine, theirs)
        )


def _flatten(x: Any, out: list[Any]) -> Any:
    if isinstance(x, (list, tuple)):
        return tuple(_flatten(v, out) for v in x)
    if isinstance(x, dict):
        return tuple((k, _flatten(v, out)) for k, v in x.items())
    out.append(x)
    return None


class CallFunction(_TargetArgsExpr):
    """A ``call_function`` node: ``fns[i](*args, **kwargs)``."""

    op = "call_function"


class CallMethod(_TargetArgsExpr):
    """A ``call_method`` node: ``args[0].fns[i](*args[1:], **kwargs)``."""

    op = "call_method"


class CallModule(_TargetArgsExpr):
    """A ``call_module`` node whose module is an instance of one of ``fns``."""

    op = "call_module"


class _TargetExprVarArgs(_TargetExpr):
    """A node calling one of ``fns`` with any arguments; they are passed to the handler."""

    def __init__(self, fns: Any, users: Multiple | int = 1) -> None:
        super().__init__(fns, users)


class CallFunctionVarArgs(_TargetExprVarArgs):
    op = "call_function"


class CallMethodVarArgs(_TargetExprVarArgs):
    op = "call_method"


class CallModuleVarArgs(_TargetExprVarArgs):
    op = "call_module"


class ListOf(PatternExpr):
    """A list argument each of whose elements matches ``pattern`` (with ``partial``: at
    least one does)."""

    def __init__(self, pattern: PatternExpr, partial: bool = False) -> None:
        if not isinstance(pattern, PatternExpr):
            raise TypeError(f"ListOf(pattern): pattern must be a PatternExpr, got {pattern!r}")
        self.pattern = pattern
        self.partial = partial

    def children(self) -> Iterator[PatternExpr]:
        yield self.pattern

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({self.pattern})"

    def pattern_eq(self, other: Any) -> bool:
        return (
            super().pattern_eq(other)
            and self.pattern.pattern_eq(other.pattern)
            and self.partial == other.partial
        )


class MultiOutputPattern(PatternExpr):
    """Several outputs matched together; the first is the anchor (the node the pass visits),
    the others are found from what it matched. ``None`` stands for an unused output."""

    def __init__(self, outputs: Sequence[PatternExpr | None]) -> None:
        outputs = list(outputs)
        if not outputs or not isinstance(outputs[0], _TargetExpr):
            raise TypeError(
                "MultiOutputPattern(outputs): the first output must be a CallFunction, "
                f"CallMethod or CallModule pattern, got {outputs[0] if outputs else None!r}"
            )
        bad = [x for x in outputs if x is not None and not isinstance(x, PatternExpr)]
        if bad:
            raise TypeError(f"MultiOutputPattern(outputs): not patterns: {bad!r}")
        self.outputs = outputs
        self.op = outputs[0].op

    @property
    def fns(self) -> list[Any]:
        return self.outputs[0].fns

    def children(self) -> Iterator[PatternExpr]:
        return (x for x in self.outputs if x is not None)

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({self.outputs})"

    def pretty_print(self, pp: Any) -> str:
        inner = ",\n  ".join(pp.pretty_print(x) for x in self.outputs)
        return f"{self.__class__.__name__}([{inner}\n])"

    def pattern_eq(self, other: Any) -> bool:
        return (
            super().pattern_eq(other)
            and len(self.outputs) == len(other.outputs)
            and all(
                a.pattern_eq(b) if isinstance(a, PatternExpr) else a == b
                for a, b in zip(self.outputs, other.outputs)
            )
        )


class RepeatedExpr(PatternExpr):
    """``inner_pattern`` at the node and at every other user of what it matched (the
    repeated ops after a ``split``)."""

    def __init__(self, inner_pattern: _TargetExpr) -> None:
        self.inner_pattern = inner_pattern
        self.op = inner_pattern.op

    @property
    def fns(self) -> list[Any]:
        return self.inner_pattern.fns

    def children(self) -> Iterator[PatternExpr]:
        yield self.inner_pattern

    def pattern_eq(self, other: Any) -> bool:
        return super().pattern_eq(other) and self.inner_pattern.pattern_eq(other.inner_pattern)


def walk(root: PatternExpr) -> Iterator[PatternExpr]:
    """Every pattern expression under ``root`` (each object once), in Inductor's match order."""
    return walk_children(root)


def pattern_text(root: PatternExpr) -> str:
    """A canonical text of the pattern's structure (shared sub-patterns named once), for
    telling duplicate registrations apart."""
    names: dict[int, str] = {}
    lines: list[str] = []

    class _Printer:
        def pretty_print(self, x: Any) -> str:
            if isinstance(x, _TargetArgsExpr):
                if id(x) not in names:
                    text = x.pretty_print(self)
                    names[id(x)] = f"n{len(names)}"
                    lines.append(f"{names[id(x)]} = {text}")
                return names[id(x)]
            if isinstance(x, PatternExpr):
                return x.pretty_print(self)
            return repr(x)

    out = _Printer().pretty_print(root)
    return "\n".join([*lines, f"output = {out}"])


#: ``fn(match) -> bool`` checks, as Inductor's ``extra_check``.
ExtraCheck = Callable[[Any], Any]


class SizeExpr(PatternExpr):
    """A value the pattern computes from its inputs' sizes (a view's shape, a scale of
    ``1/sqrt(head_dim)``): ``fn(bindings)`` gives it for a match, from the matched inputs'
    ``meta['val']``. Made by the tracing of :func:`register_replacement`, so a pattern
    traced once checks these values for every shape, as Inductor's re-trace per match does."""

    def __init__(self, fn: Callable[[dict[str, Any]], Any], text: str) -> None:
        self.fn = fn
        self.text = text

    def __repr__(self) -> str:
        return f"SizeExpr({self.text})"

    def pattern_eq(self, other: Any) -> bool:
        return super().pattern_eq(other) and self.text == other.text
