"""Textual pipelines: ``"remove_assert_ops,fuse_add_rmsnorm{eps=1e-6},fixpoint(cse,dce)"``.

Grammar (spaces are allowed around the punctuation)::

    pipeline := element ("," element)*
    element  := NAME options? ("(" pipeline ")")?
    options  := "{" (KEY "=" value)* "}"      options separated by spaces or commas
    value    := WORD | "quoted string" | "[" value ("," value)* "]"

``NAME`` is a registered pass (``fxpass list`` shows them) or ``package.module:qualname``, a
pass defined in Python: a function, a ``Pass`` class, or a pass object (a rule set, a
``Pipeline``). It is imported from the current folder too; a function or ``Pass`` class
takes options as a registered pass does (declared by its signature), and a registered one
keeps its registered name. Passes that take a nested pipeline (``fixpoint``,
``pipeline``) take one in parentheses. ``str()`` of the parsed pipeline prints the spec back:
options in ``{a=1 b=2}`` form with their values as written.

Every error is a :class:`~fxpass.core.SpecError` that points at the column where reading stopped;
an unknown pass name suggests the closest registered names; a bad option value names the
option and the type it expects.
"""

from __future__ import annotations

import copy
import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..fxutil.messages import clip
from .contract import Pass, pass_of
from .errors import NestingError, OptionError, SpecError, UnknownPassError
from .imports import resolve_import
from .options import _Mismatch
from .pass_registry import REGISTRY, Registry
from .ranges import RangeSyntaxError, parse_ranges
from .requirements import check_requirements, with_required
from .run import MAX_NESTING, PassGroup, nesting

__all__ = ["Element", "build_pipeline", "parse_spec"]

_NAME_START = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_"
_NAME_CHARS = _NAME_START + "0123456789.-:"
_STOP = set(" \t\r\n,{}()[]=\"'")


@dataclass
class OptionText:
    key: str
    column: int
    value: str | list[tuple[str, bool]]
    quoted: bool
    text: str  # the value exactly as written
    value_column: int


@dataclass
class Element:
    """One pass in a parsed spec, with where each part was written (1-based columns)."""

    name: str
    column: int
    options: list[OptionText] = field(default_factory=list)
    children: list[Element] | None = None
    paren_column: int = 0

    def text(self) -> str:
        out = self.name
        if self.options:
            out += "{" + " ".join(f"{o.key}={o.text}" for o in self.options) + "}"
        if self.children is not None:
            out += "(" + ",".join(c.text() for c in self.children) + ")"
        return out


class _Parser:
    def __init__(self, spec: str) -> None:
        self.s = spec
        self.i = 0
        self.depth = 0  # parentheses open where reading is (at most MAX_NESTING)

    def error(self, message: str, at: int | None = None) -> SpecError:
        return SpecError(message, self.s, (self.i if at is None else at) + 1)

    def peek(self) -> str:
        return self.s[self.i] if self.i < len(self.s) else ""

    def describe(self) -> str:
        c = self.peek()
        return f"'{c}'" if c else "the end of the spec"

    def skip_ws(self) -> None:
        while self.i < len(self.s) and self.s[self.i].isspace():
            self.i += 1

    def name(self, what: str) -> tuple[str, int]:
        self.skip_ws()
        start = self.i
        if self.peek() not in _NAME_START or not self.peek():
            raise self.error(f"expected {what}, got {self.describe()}")
        while self.i < len(self.s) and self.s[self.i] in _NAME_CHARS:
            self.i += 1
        return self.s[start : self.i], start

    def pipeline(self, closing: str | None, open_at: int = 0) -> list[Element]:
        elements = [self.element()]
        while True:
            self.skip_ws()
            c = self.peek()
            if c == ",":
                self.i += 1
                elements.append(self.element())
            elif c == closing or (closing is None and not c):
                return elements
            elif c == ")" and closing is None:
                raise self.error("unexpected ')' with no '(' before it")
            elif not c:
                raise self.error(f"missing ')' to close the '(' at column {open_at + 1}")
            else:
                raise self.error(f"expected ',' between passes, got {self.describe()}")

    def element(self) -> Element:
        name, col = self.name("a pass name")
        el = Element(name, col + 1)
        self.skip_ws()
        if self.peek() == "{":
            el.options = self.options()
            self.skip_ws()
        if self.peek() == "(":
            open_at = self.i
            el.paren_column = open_at + 1
            self.i += 1
            self.skip_ws()
            if self.peek() == ")":
                raise self.error(
                    f"'{clip(name)}(...)' needs at least one pass inside the parentheses"
                )
            if self.depth == MAX_NESTING:
                raise self.error(
                    f"passes nest more than {MAX_NESTING} levels deep here, deeper than fxpass "
                    "runs them: flatten the spec",
                    open_at,
                )
            self.depth += 1
            el.children = self.pipeline(")", open_at)
            self.depth -= 1
            if self.peek() != ")":  # pragma: no cover - pipeline() only returns at ')'
                raise self.error(f"missing ')' to close the '(' at column {open_at + 1}")
            self.i += 1
        return el

    def options(self) -> list[OptionText]:
        open_at = self.i
        self.i += 1
        out: list[OptionText] = []
        while True:
            self.skip_ws()
            c = self.peek()
            if c == "}":
                self.i += 1
                return out
            if not c:
                raise self.error(f"missing '}}' to close the '{{' at column {open_at + 1}")
            if out and c == ",":
                self.i += 1
                self.skip_ws()
            key, key_at = self.name("an option name")
            self.skip_ws()
            if self.peek() != "=":
                raise self.error(f"expected '=' after option '{clip(key)}', got {self.describe()}")
            self.i += 1
            self.skip_ws()
            value_at = self.i
            value, quoted = self.value(key)
            text = self.s[value_at : self.i]
            if any(o.key == key for o in out):
                raise self.error(f"option '{clip(key)}' is given twice", key_at)
            out.append(OptionText(key, key_at + 1, value, quoted, text, value_at + 1))

    def value(self, key: str) -> tuple[Any, bool]:
        c = self.peek()
        if c == "[":
            open_at = self.i
            self.i += 1
            items: list[tuple[str, bool]] = []
            self.skip_ws()
            if self.peek() == "]":
                self.i += 1
                return items, False
            while True:
                self.skip_ws()
                items.append(self.scalar(key))
                self.skip_ws()
                if self.peek() == ",":
                    self.i += 1
                elif self.peek() == "]":
                    self.i += 1
                    return items, False
                elif not self.peek():
                    raise self.error(f"missing ']' to close the '[' at column {open_at + 1}")
                else:
                    raise self.error(f"expected ',' or ']' in a list, got {self.describe()}")
        return self.scalar(key)

    def scalar(self, key: str) -> tuple[str, bool]:
        c = self.peek()
        if c in ("'", '"'):
            start = self.i
            self.i += 1
            while self.i < len(self.s) and self.s[self.i] != c:
                self.i += 2 if self.s[self.i] == "\\" else 1
            if self.i >= len(self.s):
                raise self.error("unterminated string", start)
            self.i += 1
            raw = self.s[start : self.i]
            try:
                return (json.loads(raw) if c == '"' else raw[1:-1]), True
            except json.JSONDecodeError as e:
                raise self.error(f"bad string: {e.msg}", start) from None
        start = self.i
        while self.i < len(self.s) and self.s[self.i] not in _STOP:
            self.i += 1
        if self.i == start:
            raise self.error(f"expected a value for option '{clip(key)}', got {self.describe()}")
        return self.s[start : self.i], False


def parse_spec(spec: str) -> list[Element]:
    """Parse spec text into elements (no registry lookups); raises :class:`SpecError`."""
    if not isinstance(spec, str):
        raise TypeError(f"a pipeline spec is a string, not {type(spec).__name__}")
    parser = _Parser(spec)
    parser.skip_ws()
    if not parser.peek():
        return []
    return parser.pipeline(None)


def _reference(el: Element, spec: str, registry: Any) -> Any:
    """The PassInfo for ``module:qualname`` (registered, or read from the object's
    signature when options are given), or the pass itself for other objects."""
    name = clip(el.name)
    try:
        obj = resolve_import(el.name)
    except Exception as e:
        raise SpecError(
            f"cannot import pass '{name}': {type(e).__name__}: {clip(str(e), 160)}",
            spec,
            el.column,
        ) from None
    info = registry.info_of(obj)
    is_factory = inspect.isfunction(obj) or (isinstance(obj, type) and issubclass(obj, Pass))
    if info is None and is_factory and el.options:
        info = registry._info_for(obj, None, False, "user")  # options from its signature
    if info is not None:
        return info
    if el.options or el.children is not None:
        raise SpecError(
            f"'{name}' is a {type(obj).__name__}, not a registered pass, function or Pass "
            "class; it takes no options or nested passes",
            spec,
            el.column,
        )
    try:
        p = pass_of(obj)
    except TypeError as e:
        raise SpecError(f"'{name}': {e}", spec, el.column) from None
    p = copy.copy(p) if p is obj else p  # the module's object stays as it was
    p.written_as = el.text()  # prints back as the reference
    return p


#: Options every pass takes in a spec, handled by the spec reader, not by the pass.
RESERVED_OPTIONS = ("applies_to",)


def _build(el: Element, spec: str, registry: Any, columns: dict[int, int]) -> Any:
    ranges = _ranges(el, spec)
    written = el
    if ranges is not None:  # the pass itself never sees the reserved option
        el = Element(
            el.name,
            el.column,
            [o for o in el.options if o.key not in RESERVED_OPTIONS],
            el.children,
            el.paren_column,
        )
    p = _make(el, spec, registry, columns)
    if ranges is not None:
        p = copy.copy(p)  # a registered pass object is shared: limit this entry only
        p.applies_to = ranges
        p.written_as = written.text()
    columns[id(p)] = el.column
    return p


def _ranges(el: Element, spec: str) -> dict | None:
    opt = next((o for o in el.options if o.key == "applies_to"), None)
    if opt is None:
        return None
    text, start = (opt.value, opt.value_column + 1) if opt.quoted else (opt.text, opt.value_column)
    try:
        return parse_ranges(text)
    except RangeSyntaxError as e:
        raise SpecError(f"bad applies_to: {e.message}", spec, start + e.offset) from None


def _make(el: Element, spec: str, registry: Any, columns: dict[int, int]) -> Any:
    name = clip(el.name)
    if ":" in el.name:
        info = _reference(el, spec, registry)
        if isinstance(info, Pass):
            return info
    else:
        try:
            info = registry.get(el.name)
        except UnknownPassError as e:
            raise UnknownPassError(el.name, e.suggestions, spec, el.column) from None
    if el.children is not None and not info.takes_pipeline:
        raise SpecError(f"pass '{name}' does not take a nested pipeline", spec, el.paren_column)
    if el.children is None and info.takes_pipeline:
        raise SpecError(
            f"'{name}' takes a nested pipeline: write {name}(pass1,pass2)",
            spec,
            el.column + len(el.name),
        )
    try:
        values = info.bind({o.key: (o.value, o.quoted) for o in el.options}, written=True)
    except _Mismatch as e:
        raise OptionError(str(e), spec, _column(el, e)) from None
    children = [_build(c, spec, registry, columns) for c in el.children] if el.children else None
    try:
        return info.make(values, children, spec=el.text())
    except NestingError as e:  # a module:qualname pipeline inside made it too deep
        raise SpecError(str(e), spec, el.column) from None
    except _Mismatch as e:
        raise OptionError(str(e), spec, el.column) from None
    except (ValueError, TypeError) as e:  # a pass's own constructor refused its options
        if isinstance(e, SpecError):
            raise
        raise OptionError(
            f"pass '{name}' refused its options: {type(e).__name__}: {clip(str(e), 160)}",
            spec,
            el.column,
        ) from None


def _column(el: Element, e: _Mismatch) -> int:
    """Where a bad option was written: its value, its name, or (missing) the pass."""
    for opt in el.options:
        if opt.key == e.key:
            return opt.value_column if e.at_value else opt.column
    return el.column


def build_pipeline(
    spec: str,
    registry: Registry | None = None,
    *,
    make: Callable[[list[Any]], PassGroup],
    insert_required: bool = False,
) -> PassGroup:
    """Parse ``spec`` and build the pipeline it describes: ``make(passes)`` makes it (what
    :meth:`fxpass.Pipeline.parse` calls, with its own class).

    A pass whose requirements the spec breaks (see :mod:`fxpass.core.requirements`) is a
    :class:`~fxpass.core.requirements.RequirementError` at its column; with
    ``insert_required`` the missing passes are inserted instead."""
    registry = registry or REGISTRY
    elements = parse_spec(spec)
    columns: dict[int, int] = {}
    passes = [_build(el, spec, registry, columns) for el in elements]
    try:
        pipe = make(passes)
    except NestingError as e:  # a module:qualname pipeline that nests too deep by itself
        deep = [p for p in passes if isinstance(p, PassGroup) and nesting(p) >= MAX_NESTING]
        raise SpecError(str(e), spec, columns.get(id(deep[0]), 1) if deep else 1) from None
    if insert_required:
        return with_required(pipe)
    check_requirements(pipe, spec=spec, columns=columns)
    return pipe
