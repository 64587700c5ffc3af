"""Where a pattern or rule was written: the first caller frame outside fxpass's rewrite code."""

from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def caller_location(skip_dirs: tuple[str, ...] = ()) -> str:
    """``file:line`` of the innermost frame outside ``fxpass/rewrite`` (and ``skip_dirs``)."""
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        folder = os.path.dirname(filename)
        if folder != _HERE and not any(folder.startswith(d) for d in skip_dirs):
            return f"{filename}:{frame.f_lineno}"
        frame = frame.f_back
    return "<unknown>"


def short(location: str) -> str:
    """The location with the path shortened to its last two components (for messages)."""
    path, _, line = location.rpartition(":")
    parts = path.replace("\\", "/").split("/")
    return f"{'/'.join(parts[-2:])}:{line}" if path else location
