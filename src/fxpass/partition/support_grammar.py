"""The grammar of the operator-support spec language: text to an expression tree.

What the words mean (``elementwise``, ``ops(aten.mm)``) is :func:`fxpass.partition.parse_support`'s
business; this module only reads the structure::

    expr  := term ("|" term)*           any of
    term  := factor ("&" factor)*       all of
    factor:= ("!" | "not") factor | "(" expr ")" | atom
    atom  := NAME | NAME "(" WORD ("," WORD)* ")"

>>> read_spec("norm | !ops(aten.mm)")
('any', [('atom', 'norm', None, 0), ('not', ('atom', 'ops', ['aten.mm'], 8))])
"""

from __future__ import annotations

from typing import Any

from ..core.errors import SpecError

__all__ = ["SupportSpecError", "read_spec"]

#: ``("any", [tree, ...])``, ``("all", [tree, ...])``, ``("not", tree)`` or
#: ``("atom", name, arguments or None, 0-based position of the name)``.
SpecTree = tuple[Any, ...]


class SupportSpecError(SpecError):
    """A textual or dict operator-support spec is malformed."""


def read_spec(text: str) -> SpecTree:
    """The expression tree of a spec; :class:`SupportSpecError` where the text is malformed."""
    return _Reader(text).read()


class _Reader:
    """Recursive descent over the spec language."""

    _WORD = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.:")

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def error(self, message: str, pos: int | None = None) -> SupportSpecError:
        return SupportSpecError(message, self.text, (self.pos if pos is None else pos) + 1)

    def skip(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def peek(self) -> str:
        self.skip()
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def word(self) -> tuple[str, int]:
        self.skip()
        start = self.pos
        while self.pos < len(self.text) and self.text[self.pos] in self._WORD:
            self.pos += 1
        if start == self.pos:
            found = repr(self.text[start]) if start < len(self.text) else "the end"
            raise self.error(f"expected a support name or an op, found {found}")
        return self.text[start : self.pos], start

    def read(self) -> SpecTree:
        if not self.text.strip():
            raise self.error("empty support spec (write e.g. 'elementwise | norm')")
        result = self.expr()
        if self.peek():
            raise self.error(f"unexpected {self.peek()!r} (combine supports with '|' or '&')")
        return result

    def expr(self) -> SpecTree:
        parts = [self.term()]
        while self.peek() == "|":
            self.pos += 1
            parts.append(self.term())
        return parts[0] if len(parts) == 1 else ("any", parts)

    def term(self) -> SpecTree:
        parts = [self.factor()]
        while self.peek() == "&":
            self.pos += 1
            parts.append(self.factor())
        return parts[0] if len(parts) == 1 else ("all", parts)

    def factor(self) -> SpecTree:
        c = self.peek()
        if c in ("!", "~"):
            self.pos += 1
            return ("not", self.factor())
        if c == "(":
            self.pos += 1
            inner = self.expr()
            if self.peek() != ")":
                raise self.error("expected ')'")
            self.pos += 1
            return inner
        name, start = self.word()
        if name == "not":
            return ("not", self.factor())
        args = self.arguments() if self.peek() == "(" else None
        return ("atom", name, args, start)

    def arguments(self) -> list[str]:
        self.pos += 1  # "("
        args: list[str] = []
        if self.peek() == ")":
            self.pos += 1
            return args
        while True:
            args.append(self.word()[0])
            c = self.peek()
            self.pos += 1
            if c == ")":
                return args
            if c != ",":
                raise self.error("expected ',' or ')' in the argument list", self.pos - 1)
