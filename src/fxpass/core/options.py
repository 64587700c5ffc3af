"""Typed pass options: read from a pass's signature, parsed from and printed to spec text.

A registered function pass declares options as keyword parameters with annotations and
defaults (``def fuse(gm, *, eps: float | None = None)``); a :class:`~fxpass.Pass` subclass
declares them as ``__init__`` parameters. Supported types: ``bool``, ``int``, ``float``,
``str``, ``Literal[...]``, ``X | None`` and lists/tuples of those scalars. Bounds ride on the
type with :class:`Range`: ``max_iterations: Annotated[int, Range(min=1)] = 10``.

This module is the one place option values are checked: a spec is checked while it is
parsed (a bad value is a :class:`~fxpass.core.SpecError` pointing at its column), and
``registry.create(name, **options)`` checks Python values the same way.
"""

from __future__ import annotations

import contextlib
import difflib
import inspect
import json
import re
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..fxutil.messages import INPUT_LIMIT, clip

__all__ = ["Option", "Range", "bind_options", "options_of"]

_MISSING = inspect.Parameter.empty
_BARE = re.compile(r"^[A-Za-z0-9_.+\-:/*]+$")


@dataclass(frozen=True)
class Range:
    """Inclusive bounds of a numeric option, written into its type:
    ``Annotated[int, Range(min=1)]``, ``Annotated[float, Range(min=0.0, max=1.0)]``."""

    min: float | None = None
    max: float | None = None

    def __str__(self) -> str:
        if self.min is not None and self.max is not None:
            return f"in [{format_value(self.min)}, {format_value(self.max)}]"
        if self.min is not None:
            return f">= {format_value(self.min)}"
        return f"<= {format_value(self.max)}" if self.max is not None else ""

    def admits(self, value: Any) -> bool:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return True  # not a number (e.g. None in `int | None`): the type decides
        return (self.min is None or value >= self.min) and (self.max is None or value <= self.max)


@dataclass(frozen=True)
class Option:
    """One option of a pass: its name, type annotation, default and whether it is required."""

    name: str
    annotation: Any = Any
    default: Any = None
    required: bool = False
    doc: str = ""

    # ----- describing -------------------------------------------------------------------
    @property
    def type_name(self) -> str:
        return _type_name(self.annotation)

    def describe(self) -> str:
        default = "required" if self.required else f"default {self.format(self.default)}"
        return f"{self.name}: {self.type_name} ({default})"

    # ----- converting -------------------------------------------------------------------
    def convert(self, value: Any) -> Any:
        """Check a Python value against the type; raise ValueError saying what was expected."""
        return _convert(self.annotation, value, self.name)

    def parse(self, raw: str | list[str], quoted: bool = False) -> Any:
        """Turn spec text (a bare or quoted word, or a bracketed list of words) into a value."""
        return _parse(self.annotation, raw, quoted, self.name)

    def format(self, value: Any) -> str:
        """The value as spec text that :meth:`parse` reads back."""
        return format_value(value)


def format_value(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(format_value(v) for v in value) + "]"
    text = str(value)
    if _BARE.match(text) and text.lower() not in ("true", "false", "none"):
        return text
    return json.dumps(text)


def _type_name(ann: Any) -> str:
    origin = typing.get_origin(ann)
    if ann is Any or ann is _MISSING:
        return "any"
    if origin is typing.Annotated:
        base, *extras = typing.get_args(ann)
        bounds = " ".join(str(e) for e in extras if isinstance(e, Range))
        return f"{_type_name(base)} {bounds}".strip()
    if origin is typing.Literal:
        return "one of " + "|".join(format_value(a) for a in typing.get_args(ann))
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(ann))
    if origin in (list, tuple):
        args = [a for a in typing.get_args(ann) if a is not Ellipsis]
        return f"list of {_type_name(args[0]) if args else 'any'}"
    if ann is type(None):
        return "none"
    return getattr(ann, "__name__", str(ann))


class _Mismatch(ValueError):
    """An option that does not fit; ``key`` names it and ``at_value`` says whether its value
    (rather than its name) is wrong, so a spec error can point at the right column."""

    def __init__(self, message: str, key: str | None = None, at_value: bool = False) -> None:
        super().__init__(message)
        self.key = key
        self.at_value = at_value


def bind_options(
    declared: Mapping[str, Option], given: Mapping[str, Any], owner: str, *, written: bool = False
) -> dict[str, Any]:
    """Check ``given`` against the options pass ``owner`` ``declared`` and convert each value
    (the one place options are validated). With ``written`` the values are ``(text,
    quoted)`` as read from a spec and are parsed. Raises ``_Mismatch`` naming the option."""
    values = {}
    for key, value in given.items():
        opt = declared.get(key)
        if opt is None:
            raise _Mismatch(unknown_option(declared, key, owner), key)
        try:
            values[key] = opt.parse(*value) if written else opt.convert(value)
        except _Mismatch as e:
            raise _Mismatch(str(e), key, at_value=True) from None
    for key, opt in declared.items():
        if opt.required and key not in values:
            raise _Mismatch(
                f"pass '{owner}' needs option '{key}' ({opt.type_name}): write {owner}{{{key}=...}}"
            )
    return {key: values[key] for key in declared if key in values}


def unknown_option(declared: Mapping[str, Option], key: str, owner: str) -> str:
    """The message for an option ``owner`` does not declare (with the closest name)."""
    if not declared:
        return f"pass '{owner}' takes no options, but got '{clip(key)}'"
    known = ", ".join(o.describe() for o in declared.values())
    close = difflib.get_close_matches(key, list(declared), n=1) if len(key) <= INPUT_LIMIT else []
    hint = f"; did you mean '{close[0]}'?" if close else ""
    return f"pass '{owner}' has no option '{clip(key)}'{hint} (its options: {known})"


def _convert(ann: Any, value: Any, name: str) -> Any:
    origin = typing.get_origin(ann)
    if ann is Any or ann is _MISSING:
        return value
    if origin is typing.Annotated:
        base, *extras = typing.get_args(ann)
        value = _convert(base, value, name)
        if not all(e.admits(value) for e in extras if isinstance(e, Range)):
            raise _Mismatch(f"option '{name}' expects {_type_name(ann)}, got {clip(repr(value))}")
        return value
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(ann):
            try:
                return _convert(arg, value, name)
            except _Mismatch:
                continue
        raise _Mismatch(f"option '{name}' expects {_type_name(ann)}, got {clip(repr(value))}")
    if origin is typing.Literal:
        if value in typing.get_args(ann):
            return value
        raise _Mismatch(f"option '{name}' expects {_type_name(ann)}, got {clip(repr(value))}")
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise _Mismatch(f"option '{name}' expects {_type_name(ann)}, got {clip(repr(value))}")
        args = [a for a in typing.get_args(ann) if a is not Ellipsis]
        items = [_convert(args[0], v, name) if args else v for v in value]
        return tuple(items) if origin is tuple else items
    if ann is type(None):
        if value is None:
            return None
        raise _Mismatch(f"option '{name}' expects none, got {clip(repr(value))}")
    if ann is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if ann is bool and not isinstance(value, bool):
        raise _Mismatch(f"option '{name}' expects bool, got {clip(repr(value))}")
    if ann is int and isinstance(value, bool):
        raise _Mismatch(f"option '{name}' expects int, got {clip(repr(value))}")
    if isinstance(ann, type) and not isinstance(value, ann):
        raise _Mismatch(f"option '{name}' expects {_type_name(ann)}, got {clip(repr(value))}")
    return value


def _parse_scalar(ann: Any, text: str, quoted: bool, name: str) -> Any:
    if quoted:
        return _convert(ann, text, name)
    low = text.lower()
    candidates: list[Any] = []
    if low == "none":
        candidates.append(None)
    if low in ("true", "false"):
        candidates.append(low == "true")
    with contextlib.suppress(ValueError):
        candidates.append(int(text, 0))
    with contextlib.suppress(ValueError):
        candidates.append(float(text))
    candidates.append(text)
    for value in candidates:
        try:
            return _convert(ann, value, name)
        except _Mismatch:
            continue
    raise _Mismatch(f"option '{name}' expects {_type_name(ann)}, got {clip(repr(text))}")


def _parse(ann: Any, raw: str | list, quoted: bool, name: str) -> Any:
    if isinstance(raw, list):
        if typing.get_origin(ann) is typing.Annotated:
            base = typing.get_args(ann)[0]
            if typing.get_origin(base) not in (list, tuple, typing.Union, types.UnionType):
                raise _Mismatch(f"option '{name}' expects {_type_name(ann)}, got a list")
            return _convert(ann, _parse(base, raw, quoted, name), name)
        origin = typing.get_origin(ann)
        if origin in (typing.Union, types.UnionType):
            ann = next(
                (a for a in typing.get_args(ann) if typing.get_origin(a) in (list, tuple)), ann
            )
            origin = typing.get_origin(ann)
        if origin not in (list, tuple) and ann not in (Any, _MISSING):
            raise _Mismatch(f"option '{name}' expects {_type_name(ann)}, got a list")
        args = [a for a in typing.get_args(ann) if a is not Ellipsis] or [Any]
        items = [_parse_scalar(args[0], text, q, name) for text, q in raw]
        return tuple(items) if origin is tuple else items
    return _parse_scalar(ann, raw, quoted, name)


def _type_hints(fn: Callable) -> dict[str, Any]:
    """Annotations resolved to types; an annotation that cannot be resolved stays ``Any``."""
    try:
        return typing.get_type_hints(fn, include_extras=True)
    except Exception:  # broad: one annotation it cannot resolve: resolve them one by one below
        pass
    namespace = {**vars(__import__("builtins")), **getattr(fn, "__globals__", {})}
    out = {}
    for name, ann in getattr(fn, "__annotations__", {}).items():
        try:
            out[name] = eval(ann, namespace) if isinstance(ann, str) else ann
        except Exception:  # broad: as documented, an annotation that cannot be resolved is Any
            out[name] = Any
    return out


def options_of(fn: Callable, *, skip: int = 0) -> dict[str, Option]:
    """The options a pass function or class declares: parameters after the first ``skip``."""
    target = fn.__init__ if isinstance(fn, type) else fn
    sig = inspect.signature(target)
    hints = _type_hints(target)
    params = list(sig.parameters.values())
    if isinstance(fn, type):
        params = params[1:]  # self
    out: dict[str, Option] = {}
    params = [p for p in params if p.name != "ctx"]  # the run's context (core/contract.py)
    for p in params[skip:]:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        out[p.name] = Option(
            name=p.name,
            annotation=hints.get(p.name, p.annotation if p.annotation is not _MISSING else Any),
            default=None if p.default is _MISSING else p.default,
            required=p.default is _MISSING,
        )
    return out
