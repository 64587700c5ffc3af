"""An error in one line: the rule every one-line message of fxpass follows.

>>> first_line(ValueError("\\n  shapes differ: [2, 3] vs [3, 2]\\n  at node %mul"))
'shapes differ: [2, 3] vs [3, 2]'
>>> error_summary(KeyError("w"))
"KeyError: 'w'"
>>> error_summary(RuntimeError())
'RuntimeError'

The first line of a message is its first line that is not blank, without the spaces around
it, cut at :data:`LIMIT` characters (a cut ends with ``…``). fxpass's own errors put what
went wrong and what to do on that line, so :func:`first_line` is their summary; an
exception fxpass did not raise is summarised with its type (:func:`error_summary`), since
its message alone may not say what kind of failure it was.
"""

from __future__ import annotations

__all__ = ["LIMIT", "error_summary", "first_line"]

#: The longest one-line summary, in characters.
LIMIT = 300


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
