"""Shape ranges: passes that apply only to some sizes of a symbolic dimension.

A serving compiler compiles one graph per range of a symbolic size (vLLM's compile ranges:
one graph for 1..512 tokens, another above) and runs some passes only where they pay off or
are valid (an all-reduce fusion up to a token count). fxpass spells it on the pass or on
the pipeline entry::

    fuse_x{applies_to=tokens:1..512}                 one size, inclusive bounds
    fuse_x{applies_to=tokens:513..}                  no upper bound
    fuse_x{applies_to=[tokens:1..512, batch:1..8]}   several sizes: all must fit

and in Python ``applies_to={"tokens": (1, 512)}`` — a ``Pass`` class attribute, an
attribute of a function pass, ``fp.register(..., applies_to=...)``, or
:func:`applies_to` on one entry of a pipeline.

A run happens for a *compile range* (:func:`compile_range`; the backend sets it for each
range it compiles). A range-limited pass runs only when, for each size it names, the
compile range of that size lies inside the pass's range; otherwise the report shows it as
skipped and says why. A run without a range for that size (one graph for every size)
skips it too: the pass cannot know it is valid there.

>>> with compile_range(tokens=(1, 256)):                  # doctest: +SKIP
...     fp.apply(program, "fuse_x{applies_to=tokens:1..512}")
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from .contract import Pass, as_pass

__all__ = [
    "SizeRange",
    "applies_to",
    "compile_range",
    "current_range",
    "declared_ranges",
    "format_ranges",
    "parse_ranges",
    "range_skip",
    "to_ranges",
]


@dataclass(frozen=True, order=True)
class SizeRange:
    """The inclusive range ``lo..hi`` of one symbolic size (``hi`` None: no upper bound)."""

    lo: int
    hi: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.lo, bool) or not isinstance(self.lo, int) or self.lo < 0:
            raise ValueError(f"a size range starts at a whole number >= 0, not {self.lo!r}")
        if self.hi is not None and (
            isinstance(self.hi, bool) or not isinstance(self.hi, int) or self.hi < self.lo
        ):
            raise ValueError(
                f"a size range ends at a whole number >= its start {self.lo}, not {self.hi!r}"
            )

    def __contains__(self, size: object) -> bool:
        return isinstance(size, int) and self.lo <= size and (self.hi is None or size <= self.hi)

    def covers(self, other: SizeRange) -> bool:
        """Whether every size of ``other`` lies in this range."""
        if other.lo < self.lo:
            return False
        return self.hi is None or (other.hi is not None and other.hi <= self.hi)

    def __str__(self) -> str:
        return f"{self.lo}..{'' if self.hi is None else self.hi}"


Ranges = dict[str, SizeRange]

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ITEM = re.compile(r"(?P<name>[A-Za-z_][A-Za-z0-9_]*):(?P<lo>\d+)(?P<dots>\.\.(?P<hi>\d+)?)?$")


class RangeSyntaxError(ValueError):
    """Bad range text; ``offset`` is where, 0-based, in the text."""

    def __init__(self, message: str, offset: int) -> None:
        self.message = message
        self.offset = offset
        super().__init__(message)


def _size_range(value: Any, name: str) -> SizeRange:
    if isinstance(value, SizeRange):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return SizeRange(value, value)
    if isinstance(value, (tuple, list)) and len(value) == 2:
        return SizeRange(value[0], value[1])
    raise ValueError(
        f"the range of '{name}' is a (low, high) pair of sizes (high None: unbounded), "
        f"not {value!r}"
    )


def to_ranges(value: Any) -> Ranges:
    """``{"tokens": (1, 512)}``, ``{"tokens": SizeRange(1, 512)}`` or ``"tokens:1..512"`` as
    ranges by size name; raises ValueError with what was wrong."""
    if isinstance(value, str):
        return parse_ranges(value)
    if not isinstance(value, Mapping) or not value:
        raise ValueError(
            "applies_to names at least one symbolic size and its range, e.g. "
            f"{{'tokens': (1, 512)}}, not {value!r}"
        )
    out: Ranges = {}
    for name, rng in value.items():
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ValueError(f"a size name is an identifier such as 'tokens', not {name!r}")
        out[name] = _size_range(rng, name)
    return out


def parse_ranges(text: str) -> Ranges:
    """Read ``tokens:1..512``, ``tokens:513..``, ``tokens:8`` or ``[a:1..8, b:2..]``; a
    :class:`RangeSyntaxError` says where the text went wrong."""
    body, base = text, 0
    if text.startswith("["):
        if not text.endswith("]"):
            raise RangeSyntaxError("missing ']' to close the list of ranges", len(text))
        body, base = text[1:-1], 1
    out: Ranges = {}
    offset = base
    for part in body.split(","):
        lead = len(part) - len(part.lstrip())
        item = part.strip()
        at = offset + lead
        m = _ITEM.match(item)
        if not m:
            raise RangeSyntaxError(_item_problem(item), at + _bad_offset(item))
        name = m.group("name")
        if name in out:
            raise RangeSyntaxError(f"size '{name}' is given twice", at)
        lo = int(m.group("lo"))
        hi = lo if not m.group("dots") else (int(m.group("hi")) if m.group("hi") else None)
        if hi is not None and hi < lo:
            raise RangeSyntaxError(
                f"the range of '{name}' ends at {hi}, before its start {lo}", at + m.start("hi")
            )
        out[name] = SizeRange(lo, hi)
        offset += len(part) + 1
    return out


def _bad_offset(item: str) -> int:
    """Where in ``name:lo..hi`` reading stops."""
    m = _NAME.match(item)
    if not m:
        return 0
    i = m.end()
    if i >= len(item) or item[i] != ":":
        return i
    i += 1
    j = i
    while j < len(item) and item[j].isdigit():
        j += 1
    if j == i or j == len(item):
        return j
    if not item.startswith("..", j):
        return j
    j += 2
    while j < len(item) and item[j].isdigit():
        j += 1
    return j


def _item_problem(item: str) -> str:
    if not item:
        return "expected a range such as tokens:1..512"
    return (
        f"'{item}' is not a size range: write name:low..high (tokens:1..512), "
        "name:low.. (no upper bound) or name:size"
    )


def format_ranges(ranges: Mapping[str, SizeRange]) -> str:
    """The spec text of ``ranges`` (what :func:`parse_ranges` reads back)."""
    items = [f"{name}:{rng}" if rng.lo != rng.hi else f"{name}:{rng.lo}"
             for name, rng in ranges.items()]  # fmt: skip
    return items[0] if len(items) == 1 else "[" + ",".join(items) + "]"


# ----- what a pass declares -----------------------------------------------------------------
def declared_ranges(p: Any) -> Ranges | None:
    """The ranges ``p`` applies to: set on the pass (or pipeline entry), or declared by the
    function or object it wraps; None when it applies to every size."""
    for obj in (p, getattr(p, "fn", None), getattr(p, "obj", None)):
        value = getattr(obj, "applies_to", None) if obj is not None else None
        if value:
            return to_ranges(value)
    return None


def applies_to(p: Any, ranges: Mapping[str, Any] | str | None = None, **sizes: Any) -> Pass:
    """A copy of the pass ``p`` (anything :func:`fxpass.as_pass` takes) limited to ``ranges``:
    ``applies_to(fuse_x, tokens=(1, 512))``. It prints as ``fuse_x{applies_to=tokens:1..512}``.
    """
    given = dict(to_ranges(ranges)) if ranges is not None else {}
    given.update(to_ranges(sizes) if sizes else {})
    if not given:
        raise ValueError("applies_to needs at least one size range, e.g. tokens=(1, 512)")
    base = as_pass(p)
    new = copy.copy(base)
    new.applies_to = given
    new.written_as = _with_option(base.spec, f"applies_to={format_ranges(given)}")
    return new


_OLD_OPTION = re.compile(r"\s*applies_to=(\[[^\]]*\]|[^\s},]+)")


def _with_option(text: str, option: str) -> str:
    """``name(...)`` -> ``name{option}(...)``; an ``applies_to`` written before is replaced."""
    head, paren, rest = text.partition("(")
    head = _OLD_OPTION.sub("", head).replace("{}", "")
    if head.endswith("}"):
        return f"{head[:-1]} {option}}}{paren}{rest}"
    return f"{head}{{{option}}}{paren}{rest}"


# ----- the compile range of a run -----------------------------------------------------------
_CURRENT: contextvars.ContextVar[Ranges | None] = contextvars.ContextVar(
    "fxpass_compile_range", default=None
)


@contextlib.contextmanager
def compile_range(ranges: Mapping[str, Any] | None = None, **sizes: Any) -> Iterator[Ranges]:
    """Run the pipelines inside the block for this compile range: ``compile_range(tokens=(1,
    512))``. A static size is a one-size range, ``tokens=7``. Nested blocks add sizes."""
    given = dict(to_ranges(ranges)) if ranges else {}
    given.update(to_ranges(sizes) if sizes else {})
    merged = {**(_CURRENT.get() or {}), **given}
    token = _CURRENT.set(merged)
    try:
        yield merged
    finally:
        _CURRENT.reset(token)


def current_range() -> Ranges | None:
    """The compile range of the runs now in progress (None: no range, one graph for all)."""
    return _CURRENT.get()


def range_skip(p: Any, current: Mapping[str, SizeRange] | None = None) -> str | None:
    """Why ``p`` must not run in the compile range ``current`` (default: the range of the
    run in progress), or None when it applies."""
    wanted = declared_ranges(p)
    if not wanted:
        return None
    current = current_range() if current is None else current
    for name, rng in wanted.items():
        have = (current or {}).get(name)
        if have is None:
            return (
                f"applies to {name}:{rng} only, and this run has no range for '{name}' "
                "(compile per range: fxpass.backend(ranges=...) or "
                "fxpass.core.ranges.compile_range)"
            )
        if not rng.covers(have):
            return f"applies to {name}:{rng}, not to this compile's {name}:{have}"
    return None
