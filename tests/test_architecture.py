"""docs/architecture.md's promises that a linter does not check: module size, and that the
layer list names every package (lint-imports checks the imports themselves)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "fxpass"
LIMIT = 600


def test_no_module_is_over_the_limit():
    long = {
        str(p.relative_to(PACKAGE)): n
        for p in PACKAGE.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > LIMIT
    }
    assert not long, f"modules over {LIMIT} lines (split along a real seam): {long}"


def test_the_layer_list_names_every_package_and_the_doc_shows_it():
    pyproject = (ROOT / "pyproject.toml").read_text()
    layers = re.search(r"^layers = \[(.*?)\]", pyproject, re.S | re.M)
    assert layers is not None
    named = set(re.findall(r"\w+", " ".join(re.findall(r'"([^"]+)"', layers.group(1)))))
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert packages <= named, f"packages missing from the layers: {packages - named}"
    doc = (ROOT / "docs" / "architecture.md").read_text()
    assert all(re.search(rf"^  .*\b{name}\b", doc, re.M) for name in packages)


def test_test_modules_have_unique_basenames():
    # The tests directories are not packages: pytest imports each test file by its basename,
    # and two files with one basename fail collection ("import file mismatch") depending on
    # which worker collects them first.
    seen: dict[str, Path] = {}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        other = seen.setdefault(path.name, path)
        assert other == path, f"{path.relative_to(ROOT)} and {other.relative_to(ROOT)}"


#: torch's private attributes that fxpass reads or writes only through fxutil (fx_internals.py,
#: ops.py):
#: a torch upgrade that renames one changes one file.
PRIVATE_TORCH = {"_schema", "_out_spec", "_in_spec", "_modules", "_buffers", "_parameters",
                 "_codegen"}  # fmt: skip


def _private_torch_uses(source: str) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in PRIVATE_TORCH:
            found.append((node.lineno, node.attr))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value in PRIVATE_TORCH
        ):
            found.append((node.lineno, node.args[1].value))
    return found


def test_private_torch_attributes_are_read_only_in_fxutil():
    outside = {
        f"{p.relative_to(PACKAGE)}:{line}": attr
        for p in sorted(PACKAGE.rglob("*.py"))
        if "fxutil" not in p.relative_to(PACKAGE).parts
        for line, attr in _private_torch_uses(p.read_text())
    }
    assert not outside, (
        f"use the helpers in fxutil/fx_internals.py or fxutil/ops.py instead: {outside}"
    )


def test_the_walk_sees_each_form_of_access():
    planted = "op._schema.name\ngetattr(gm, '_out_spec', None)\ng._codegen = c\nm._modules\n"
    assert sorted(_private_torch_uses(planted)) == [
        (1, "_schema"), (2, "_out_spec"), (3, "_codegen"), (4, "_modules")
    ]  # fmt: skip


def test_module_basenames_are_unique():
    # A module named like another (rewrite/interpret.py beside interpret.py, a distributed
    # rewrite.py beside the rewrite package) reads as the other in tracebacks and imports.
    seen: dict[str, Path] = {}
    for path in sorted((ROOT / "src" / "fxpass").rglob("*.py")):
        if path.name == "__init__.py":
            continue
        other = seen.setdefault(path.name, path)
        assert other == path, f"{path.relative_to(ROOT)} and {other.relative_to(ROOT)}"
