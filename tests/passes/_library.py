"""The pass library as the tests find it — from the source tree, the registry and the docs,
never from a list: a pass added as docs/architecture.md's "Adding a pass" says is covered
by every test that asks here (tests/passes/test_edge.py, tests/passes/test_library.py)."""

from __future__ import annotations

import re
from pathlib import Path

from fxpass.core.pass_registry import REGISTRY

#: the pages whose pass tables describe the library (a row per pass: ``| `name` | ...``)
PAGES = ("passes.md", "fusion.md")


def library_root() -> Path:
    import fxpass.passes

    return Path(fxpass.passes.__file__).parent


def pass_files(root: Path | None = None) -> dict[str, Path]:
    """``passes/<group>/<name>.py`` by name: one pass per file, the file named for it."""
    root = root or library_root()
    return {p.stem: p for p in sorted(root.glob("*/*.py")) if not p.name.startswith("_")}


def library_passes(root: Path | None = None) -> list[str]:
    """The registered passes defined under ``passes/<group>/`` (not pipelines)."""
    root = (root or library_root()).resolve()
    out = []
    for info in REGISTRY.infos():
        path = Path(str(info.source).rsplit(":", 1)[0]).resolve()
        if path.parent.parent == root and path.parent.name != "__pycache__":
            out.append(info.name)
    return sorted(out)


def documented(docs: Path) -> set[str]:
    """The pass names with a row in the pass tables of ``docs`` (the folder)."""
    rows = "\n".join((docs / page).read_text() for page in PAGES)
    return set(re.findall(r"^\| `(\w+)` \|", rows, re.M))


def untested(root: Path, tests: Path) -> list[str]:
    """``<group>/<name>`` of the pass files under ``root`` without their mirrored test,
    ``tests/passes/<group>/test_<name>.py`` (``tests``: the tests/passes folder)."""
    return [
        f"{path.parent.name}/{name}"
        for name, path in pass_files(root).items()
        if not (tests / path.parent.name / f"test_{name}.py").exists()
    ]
