"""The one import rule: code the user names is imported from the current folder too.

The ``fxpass`` command imports user code in four places — ``module:function`` TARGETs,
``module:function`` passes in a spec, ``--import MODULE`` and crash reproducers — and all of
them resolve names the same way, as ``python -m`` does: the current folder comes first on
the import path (:func:`cwd_on_path`). Only names the user gave are imported.

When a program calls a custom op no loaded module registers, :func:`op_registrars` finds the
installed modules whose source registers it — by reading their text, importing nothing — so
the error can name the module to import.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
import sysconfig
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = ["cwd_on_path", "import_modules", "op_registrars", "resolve_import", "unknown_op"]


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


# ----- who registers a custom op ----------------------------------------------------------------
#: Calls that register an op from Python source: ``torch.library.custom_op("ns::name", ...)``,
#: ``@custom_op("ns::name")``, ``torch.library.define("ns::name", ...)``, ``triton_op``,
#: ``Library("ns", ...)`` with ``lib.define("name(...)")``.
_REGISTERS = re.compile(rb"\b(custom_op|triton_op|define|Library)\s*\(")


#: How torch says a program calls an op no loaded module registers.
_UNKNOWN_OP = re.compile(r"resolve torch\.ops\.(\w+)\.(\w+)[\w.]* to an operator")


def unknown_op(error: BaseException) -> str | None:
    """The op (``ns::name``) that no loaded module registers, when that is why ``error``
    (or an exception it was raised from) happened; None otherwise."""
    seen: list[BaseException] = []
    e: BaseException | None = error
    while e is not None and e not in seen:
        seen.append(e)
        found = _UNKNOWN_OP.search(str(e))
        if found:
            return f"{found.group(1)}::{found.group(2)}"
        e = e.__cause__ or e.__context__
    return None


def op_registrars(qualname: str, *, limit: int = 3) -> list[str]:
    """The installed modules whose Python source registers the custom op ``ns::name``
    (``transformers::grouped_mm_fallback`` -> ``["transformers.integrations.moe"]``).

    Reads source files on the import path (the standard library aside), the packages named
    like the namespace first, and stops after ``limit`` modules; imports nothing. A warm scan
    of a full site-packages takes about a second: meant for error messages. Ops registered
    from C++ (``TORCH_LIBRARY``) are not found."""
    ns, _, name = qualname.partition("::")
    if not ns or not name:
        return []
    quoted = [f"{q}{qualname}{q}".encode() for q in "\"'"]
    library = re.compile(rf"""Library\(\s*["']{re.escape(ns)}["']""".encode())
    defines = re.compile(rf"""define\(\s*["']{re.escape(name)}\s*\(""".encode())
    found: list[str] = []
    was_likely = True
    for path, module, likely in _sources(ns):
        if found and (len(found) >= limit or (was_likely and not likely)):
            break  # the packages named like the namespace had it: the rest are not read
        was_likely = likely
        try:
            text = path.read_bytes()
        except OSError:
            continue
        if any(q in text for q in quoted):
            hit = _REGISTERS.search(text) is not None
        else:
            hit = b"Library(" in text and bool(library.search(text) and defines.search(text))
        if hit and module not in found:
            found.append(module)
    return found


def _sources(ns: str) -> Iterator[tuple[Path, str, bool]]:
    """(file, module name, likely) of every ``.py`` file on the import path: the top-level
    packages whose name starts with ``ns`` first (``transformers::`` ops live in
    ``transformers``), marked likely."""
    skip = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib")}
    roots = [Path(p or ".").resolve() for p in sys.path if p not in skip]
    roots = [r for r in dict.fromkeys(roots) if r.is_dir() and str(r) not in skip]
    tops = [(r, top) for r in roots for top in _entries(r)]
    tops.sort(key=lambda rt: not rt[1].name.lower().startswith(ns.lower()))
    for root, top in tops:
        likely = top.name.lower().startswith(ns.lower())
        if top.is_file():
            if top.suffix == ".py":
                yield top, top.stem, likely
            continue
        for folder, dirs, files in os.walk(top):
            dirs[:] = [d for d in dirs if d.isidentifier()]
            for f in files:
                if f.endswith(".py"):
                    yield Path(folder, f), _module_name(root, Path(folder, f)), likely


def _entries(root: Path) -> list[Path]:
    try:
        return [p for p in root.iterdir() if p.name.isidentifier() or p.suffix == ".py"]
    except OSError:
        return []


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)
