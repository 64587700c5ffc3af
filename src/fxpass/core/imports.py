"""The one import rule: code the user names is imported from the current folder too.

The ``fxpass`` command imports user code in four places — ``module:function`` TARGETs,
``module:function`` passes in a spec, ``--import MODULE`` and crash reproducers — and all of
them resolve names the same way, as ``python -m`` does: the current folder comes first on
the import path (:func:`cwd_on_path`). Only names the user gave are imported.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = ["cwd_on_path", "import_modules", "resolve_import"]


def cwd_on_path() -> None:
    """Put the current folder first on ``sys.path`` (once), as ``python -m`` does."""
    cwd = str(Path.cwd())
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)


def resolve_import(ref: str) -> Any:
    """Import ``package.module:attr.path`` (a pass, target or rule set named by where it is
    defined), from the current folder too."""
    module_name, _, attr = ref.partition(":")
    cwd_on_path()
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def import_modules(names: Iterable[str]) -> list[ModuleType]:
    """Import each module in ``names`` (``--import``), from the current folder too."""
    cwd_on_path()
    return [importlib.import_module(name) for name in names]
