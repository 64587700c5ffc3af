"""An error in one line: the rule every one-line message of fxpass follows.

>>> first_line(ValueError("\\n  shapes differ: [2, 3] vs [3, 2]\\n  at node %mul"))
'shapes differ: [2, 3] vs [3, 2]'
>>> error_summary(KeyError("w"))
"KeyError: 'w'"
>>> error_summary(RuntimeError())
'RuntimeError'
>>> clip("a" * 50_000 + "b" * 50_000, limit=21)
'aaaaaaaaaaaaa…bbbbbbb (100,000 characters)'
>>> excerpt("a,b,c", 3)
('a,b,c', 3)

The first line of a message is its first line that is not blank, without the spaces around
it, cut at :data:`LIMIT` characters (a cut ends with ``…``). fxpass's own errors put what
went wrong and what to do on that line, so :func:`first_line` is their summary; an
exception fxpass did not raise is summarised with its type (:func:`error_summary`), since
its message alone may not say what kind of failure it was.

Whatever the user wrote — a pass name, a spec, a module, a path — an error quotes through
:func:`clip` (or :func:`excerpt`, around the column it points at), so an input of any length
gives a line of a few hundred characters; :func:`cap` bounds a whole line (the command's
last guard, :data:`LINE_LIMIT`).
"""

from __future__ import annotations

__all__ = [
    "INPUT_LIMIT",
    "LIMIT",
    "LINE_LIMIT",
    "cap",
    "clip",
    "error_summary",
    "excerpt",
    "first_line",
]

#: The longest one-line summary, in characters.
LIMIT = 300
#: The longest user input an error quotes whole, in characters.
INPUT_LIMIT = 80
#: The longest error line the command prints, in characters.
LINE_LIMIT = 500


def first_line(error: BaseException | str, limit: int = LIMIT) -> str:
    """The first non-blank line of ``error``'s message (or of a string), stripped and cut at
    ``limit`` characters; ``""`` for an empty message."""
    for line in str(error).splitlines():
        line = line.strip()
        if line:
            return line if len(line) <= limit else line[: limit - 1] + "…"
    return ""


def error_summary(error: BaseException, limit: int = LIMIT) -> str:
    """``Type: first line`` (just ``Type`` when the message is empty): an exception fxpass
    did not raise, in one line."""
    line = first_line(error, limit)
    name = type(error).__name__
    return f"{name}: {line}" if line else name


def clip(text: str, limit: int = INPUT_LIMIT) -> str:
    """A user's input as an error quotes it: whole when it has at most ``limit``
    characters, else its start and end around ``…``, with its length."""
    text = str(text)
    if len(text) <= limit:
        return text
    head = (limit - 1) * 2 // 3
    tail = limit - 1 - head
    return f"{text[:head]}…{text[len(text) - tail :]} ({len(text):,} characters)"


def excerpt(text: str, column: int, limit: int = INPUT_LIMIT) -> tuple[str, int]:
    """The part of ``text`` around the 1-based ``column`` an error points at, at most
    ``limit`` characters (``…`` where it was cut), and that column within the part."""
    if len(text) <= limit:
        return text, column
    start = max(0, min(column - 1 - limit // 2, len(text) - limit))
    part = text[start : start + limit]
    column -= start
    if start > 0:
        part = "…" + part[1:]
    if start + limit < len(text):
        part = part[:-1] + "…"
    return part, column


def cap(line: str, limit: int = LINE_LIMIT) -> str:
    """``line`` cut in the middle to at most ``limit`` characters (plus the count of what
    was left out), keeping its start, which says what went wrong, and its end, which often
    says what to do."""
    if len(line) <= limit:
        return line
    note = f" …({len(line):,} characters left out)… "  # as long as the real note, or longer
    keep = max(limit - len(note), 2)
    note = f" …({len(line) - keep:,} characters left out)… "
    head = keep * 2 // 3
    return line[:head] + note + line[len(line) - (keep - head) :]
