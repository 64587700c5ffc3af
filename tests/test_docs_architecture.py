"""docs/architecture.md names only what exists: every file, folder, module and name it puts
in backticks is looked up, so a rename that forgets the map fails here instead of
misleading the next reader.

What is looked up (anything else in backticks is prose, code or a placeholder):

- a path (``core/run.py``, ``compat/inductor/``, ``tests/passes/test_edge.py``): under the
  checkout, or under ``src/fxpass``; a bare file name (``_replay.py``) is in the folder the
  line named last, else a module of fxpass; on a line that says (or follows one that says) "a new file" (a recipe's example), the folder of the path exists;
- a path followed by a name (``fxutil/views.py`` ``returns_view``, ``verify/invariants.py``
  (``keeps_metadata``)): the name is defined in that module;
- a dotted name (``fxpass.core``, ``fp.register``, ``Runner.run``, ``torch.library.opcheck``,
  ``contextlib.suppress(...)``): imported, and each attribute found;
- a class-like name (``PassContext``, ``RunPolicy``) or a constant (``OP_PACKAGES``): defined
  in some module of fxpass (or a builtin); a constant may be an environment variable fxpass
  reads or a name the tests define (``_BUSY_CHANGES``).
"""

from __future__ import annotations

import builtins
import doctest
import importlib
import pkgutil
import re
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "fxpass"
DOC = ROOT / "docs" / "architecture.md"

_TICKED = re.compile(r"`([^`\n]+)`")
_PATH = re.compile(r"^[\w.\-/]+$")
_DOTTED = re.compile(r"^@?([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?:\(.*\))?$")
_CLASS = re.compile(r"^([A-Z][a-z]\w*|[A-Z])(?:\(.*\))?$")
_CONSTANT = re.compile(r"^_?[A-Z][A-Z0-9_]+$")
_AFTER_PATH = re.compile(r"`([\w./\-]+\.py)`(?: \(| )`(\w+)`")


def _ticked(text: str) -> list[str]:
    """The backticked spans of prose (not of fenced blocks, whose code runs elsewhere)."""
    prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return _TICKED.findall(prose)


def _is_path(token: str) -> bool:
    return bool(_PATH.match(token)) and ("/" in token or re.search(r"\.(py|md|toml)$", token))


def _path_exists(token: str, folder: Path | None = None) -> Path | None:
    """The file or folder ``token`` names; a bare file name in the line's ``folder`` (the
    last folder the line named before it), else anywhere in fxpass."""
    if "/" not in token and not token.endswith(".py"):
        return next((b / token for b in (ROOT, ROOT / "docs") if (b / token).exists()), None)
    if "/" not in token:
        if folder is not None:
            return folder / token if (folder / token).exists() else None
        found = [p for p in PACKAGE.rglob(token) if "__pycache__" not in p.parts]
        found += [p for p in (ROOT / "src").glob(token)]
        return found[0] if found else None
    for base in (ROOT, PACKAGE, ROOT / "src", ROOT / "docs"):
        if (base / token).exists():
            return base / token
    return None


@cache
def _modules() -> dict[str, ModuleType]:
    """Every importable module of fxpass (the optional extras' where they are installed)."""
    import fxpass

    out: dict[str, ModuleType] = {"fxpass": fxpass}
    for info in pkgutil.walk_packages(fxpass.__path__, "fxpass.", onerror=lambda name: None):
        if info.name == "fxpass.__main__":
            continue
        try:
            out[info.name] = importlib.import_module(info.name)
        except ImportError as e:  # an optional extra (triton, executorch) that is not installed
            if (e.name or "").startswith("fxpass"):
                raise
    return out


@cache
def _index() -> dict[str, Any]:
    """Every top-level name of every fxpass module."""
    names: dict[str, Any] = {}
    for module in _modules().values():
        for name, value in vars(module).items():
            names.setdefault(name, value)
    return names


def _module_of(path: Path) -> ModuleType | None:
    rel = path.relative_to(ROOT / "src").with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return _modules().get(".".join(parts))


def _resolve_dotted(name: str) -> bool:
    parts = name.split(".")
    if parts[0] == "fp":
        parts[0] = "fxpass"
    head = parts[0]
    if head in _index() and head != "fxpass":  # Runner.run, Pipeline.parse
        obj: Any = _index()[head]
    else:
        try:
            obj = importlib.import_module(head)
        except ModuleNotFoundError:
            return False
    for i, attr in enumerate(parts[1:], 1):
        if hasattr(obj, attr):
            obj = getattr(obj, attr)
            continue
        try:
            obj = importlib.import_module(".".join(parts[: i + 1]))
        except ModuleNotFoundError:
            return False
    return True


@cache
def _source_text() -> str:
    files = [*PACKAGE.rglob("*.py"), *(ROOT / "tests").rglob("*.py")]
    files = [p for p in files if p != Path(__file__).resolve()]
    return "\n".join(p.read_text() for p in files)


def problems(text: str) -> list[str]:
    """What ``text`` (a page like docs/architecture.md) names that does not exist."""
    out = []
    previous = ""
    for line in _code_free(text).splitlines():
        out += _line_problems(line, new_file="a new file" in previous + line)
        previous = line
    return list(dict.fromkeys(out))


def _line_problems(line: str, new_file: bool) -> list[str]:
    out = []
    folder: Path | None = None
    for token in _ticked(line):
        if "<" in token or token.startswith(("-", "#", "fxpass::")):  # placeholders, flags
            continue
        if _is_path(token):
            found = _path_exists(token, None if "/" in token else folder)
            if found is None and new_file:  # a recipe's example: its folder exists
                found = _path_exists(str(Path(token).parent))
            if found is None:
                out.append(f"no file or folder {token}")
            elif "/" in token:
                folder = found if found.is_dir() else found.parent
        elif m := _DOTTED.match(token):
            first = m.group(1).split(".")[0]
            checked = first in ("fp", "fxpass", "torch") or first[0].isupper()
            if (checked or first in _stdlib()) and not _resolve_dotted(m.group(1)):
                out.append(f"no name {m.group(1)}")
        elif m := _CLASS.match(token):
            name = m.group(1)
            if name not in _index() and not hasattr(builtins, name):
                out.append(f"no class or name {name}")
        elif _CONSTANT.match(token):
            known = token in _index() or hasattr(doctest, token)
            if not known and not re.search(rf"\b{token}\b", _source_text()):
                out.append(f"no constant {token}")
    for path, name in _AFTER_PATH.findall(line):
        file = _path_exists(path)
        module = _module_of(file) if file is not None and file.is_relative_to(PACKAGE) else None
        if module is not None and not hasattr(module, name) and name not in _submodules(module):
            out.append(f"{path} defines no {name}")
    return out


def _code_free(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def _submodules(module: ModuleType) -> set[str]:
    return {n.rpartition(".")[2] for n in _modules() if n.startswith(f"{module.__name__}.")}


@cache
def _stdlib() -> frozenset[str]:
    import sys

    return frozenset(sys.stdlib_module_names)


def test_every_file_module_and_name_the_architecture_names_exists():
    assert problems(DOC.read_text()) == []


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        (
            "`compat/inductor/`: `_pass.py`, `install()` (`_install.py`)",
            "no file or folder _install.py",
        ),
        ("lives in `fxutil/fx.py`", "no file or folder fxutil/fx.py"),
        ("see `fp.no_such_name`", "no name fp.no_such_name"),
        ("`Runner.walk` runs it", "no name Runner.walk"),
        ("the `PassContxt` it sees", "no class or name PassContxt"),
        ("`FXPASS_NO_SUCH_SETTING`", "no constant FXPASS_NO_SUCH_SETTING"),
        ("`fxutil/views.py` `returns_a_view`", "fxutil/views.py defines no returns_a_view"),
    ],
)
def test_the_check_finds_each_kind_of_stale_name(line, problem):
    assert problem in problems(line)


def test_the_check_passes_what_exists():
    line = (
        "`core/run.py` `compat/inductor/` `_replay.py` `fp.register` `Runner.run` `Editor` "
        "`OP_PACKAGES` `TORCH_TRACE` `fxutil/views.py` `returns_view` `torch.library.opcheck` "
        "`contextlib.suppress(Exception)` `tests/passes/<group>/test_<name>.py`"
    )
    assert problems(line) == []


def _module_references() -> list[tuple[str, str, Path]]:
    """``(module, reference, the path it names)`` for every ``:mod:`` of fxpass's docstrings
    (``~.x`` and ``.x`` relative to the module's package, ``..x`` one up)."""
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT / "src").with_suffix("")
        package = list(rel.parts[:-1])  # a package's __init__ and its modules alike
        for ref in re.findall(r":mod:`~?([\w.]+)`", path.read_text()):
            if ref.startswith("."):
                ups = len(ref) - len(ref.lstrip(".")) - 1
                parts = package[: len(package) - ups] + ref.lstrip(".").split(".")
            else:
                parts = ref.split(".")
            if parts[0] == "fxpass":
                out.append((".".join(rel.parts), ref, (ROOT / "src").joinpath(*parts)))
    return out


def test_every_module_a_docstring_names_exists():
    refs = _module_references()
    assert len(refs) > 100
    missing = [
        f"{module}: {ref}"
        for module, ref, path in refs
        if not (path.with_suffix(".py").exists() or (path / "__init__.py").exists())
    ]
    assert missing == []


def test_the_context_variable_table_lists_every_context_variable():
    """docs/architecture.md's "State that travels with a run" names each ContextVar of fxpass
    (by the name it is created with) and where it is defined — no more, no fewer."""
    found = set()
    for path in PACKAGE.rglob("*.py"):
        for name in re.findall(r"ContextVar\(\s*\"(\w+)\"", path.read_text()):
            found.add((name, str(path.relative_to(PACKAGE))))
    doc = DOC.read_text()
    section = doc[doc.index("### State that travels with a run") :]
    rows = set(re.findall(r"^\| `(\w+)` \| `([\w/]+\.py)` \|", section, re.M))
    assert rows == found
    count = re.search(r"through (\w+) context variables", section)
    words = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
    assert count is not None and words.index(count.group(1)) == len(found)
