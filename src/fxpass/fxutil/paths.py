"""Dotted attribute paths: the ``target`` of ``get_attr`` and ``call_module`` nodes.

(torch's private ``torch.fx.graph_module._has_attr`` is no substitute: it walks the
booleans ``hasattr`` returns instead of the attributes, so nested paths come out wrong.)
"""

from __future__ import annotations

from typing import Any

__all__ = ["del_path", "find_path", "get_path", "has_path"]


def get_path(obj: Any, target: str) -> Any:
    """``obj.a.b.c`` for ``target == "a.b.c"``; AttributeError when a step is missing."""
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def find_path(obj: Any, target: str, default: Any = None) -> Any:
    """:func:`get_path`, or ``default`` when a step is missing."""
    try:
        return get_path(obj, target)
    except AttributeError:
        return default


def has_path(obj: Any, target: str) -> bool:
    """Whether every step of ``target`` exists from ``obj``."""
    try:
        get_path(obj, target)
    except AttributeError:
        return False
    return True


def del_path(obj: Any, target: str) -> None:
    """``del obj.a.b.c`` for ``target == "a.b.c"``."""
    owner, _, last = target.rpartition(".")
    delattr(get_path(obj, owner) if owner else obj, last)
