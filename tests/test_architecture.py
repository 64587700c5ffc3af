"""docs/architecture.md's promises that a linter does not check: module size, and that the
layer list names every package (lint-imports checks the imports themselves)."""

from __future__ import annotations

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
