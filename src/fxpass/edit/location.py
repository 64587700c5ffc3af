"""Where fxpass code was called from or written: the one source-location helper.

A rule, a pattern or an edit is located at the first frame outside fxpass's rewriting and
editing code, so that what a report names is the user's line (or the library pass's),
never a helper of the machinery that built it.
"""

from __future__ import annotations

import inspect
import os
import sys
from typing import Any

__all__ = ["caller_location", "file_line", "short", "source_location"]

_HERE = os.path.dirname(os.path.abspath(__file__))
_MACHINERY = (_HERE, os.path.join(os.path.dirname(_HERE), "rewrite"))


def _inside(folder: str, roots: tuple[str, ...]) -> bool:
    return any(folder == r or folder.startswith(r + os.sep) for r in roots)


def caller_location(skip_dirs: tuple[str, ...] = ()) -> str:
    """``file:line`` of the innermost frame outside fxpass's rewrite and edit packages (and
    outside ``skip_dirs``)."""
    roots = _MACHINERY + tuple(skip_dirs)
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not _inside(os.path.dirname(filename), roots):
            return f"{filename}:{frame.f_lineno}"
        frame = frame.f_back
    return "<unknown>"


def source_location(obj: Any) -> str:
    """``file:line`` where a function or class is defined ("" when Python cannot tell)."""
    try:
        return f"{inspect.getsourcefile(obj)}:{inspect.getsourcelines(obj)[1]}"
    except (TypeError, OSError):
        return ""


def short(location: str) -> str:
    """The location with the path shortened to its last two components (for messages)."""
    path, _, line = location.rpartition(":")
    parts = path.replace("\\", "/").split("/")
    return f"{'/'.join(parts[-2:])}:{line}" if path else location


def file_line(location: str) -> str:
    """The location as ``file.py:line``, without the folder ("" for an unknown one)."""
    path, _, line = location.rpartition(":")
    return f"{os.path.basename(path)}:{line}" if path else ""
