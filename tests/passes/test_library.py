"""The pass library is what docs/architecture.md's "Adding a pass" says: one pass per file
under ``passes/<group>/``, each with its mirrored test and a row in the docs, and nothing
else to edit — proved by following the recipe in a copy of the package."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from _library import documented, library_passes, library_root, pass_files, untested

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


def test_each_pass_file_registers_the_pass_it_is_named_for():
    assert set(library_passes()) == set(pass_files())
    assert len(pass_files()) >= 13


def test_every_library_pass_has_a_row_in_the_docs_and_a_mirrored_test():
    assert set(library_passes()) - documented(ROOT / "docs") == set()
    assert untested(library_root(), ROOT / "tests" / "passes") == []


def _recipe() -> tuple[str, str]:
    """The file the recipe writes and its text, read from docs/architecture.md."""
    doc = (ROOT / "docs" / "architecture.md").read_text()
    section = doc[doc.index("## Adding a pass\n") :]
    section = section[: section.index("\n## ", 1)]
    path = re.search(r"a new file\s+`(src/fxpass/passes/\w+/\w+\.py)`:", section)
    block = re.search(r"^( *)```py\n(.*?)^\1```$", section, re.S | re.M)
    assert path is not None and block is not None, "the recipe shows a pass file and its path"
    return path.group(1), textwrap.dedent(block.group(2))


_PROBE = """
import json, sys
from pathlib import Path
import torch
import fxpass as fp
from _library import documented, library_passes, library_root, untested

name, docs, tests = sys.argv[1:4]
root = library_root()
assert str(root).startswith(sys.argv[4]), root  # the copy, not the checkout
ep = torch.export.export(type("M", (torch.nn.Module,), {"forward": lambda s, x: x * x})(),
                         (torch.randn(3),))
result = fp.apply(ep, name)
print(json.dumps({
    "library": library_passes(),
    "documented": name in documented(Path(docs)),
    "untested": untested(root, Path(tests)),
    "stats": result.report.stats(),
}))
"""


def _probe(tmp: Path, name: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp / "src"), str(HERE)])}
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, name, str(tmp / "docs"), str(tmp / "tests"), str(tmp)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_adding_a_pass_as_the_recipe_says(tmp_path):
    """Step 1 of the recipe, in a copy: the new file alone registers the pass and the
    library (so test_edge.py's parametrisation) includes it; the docs and the mirrored
    test are asked for until steps 2 and 3 are done, and then nothing else is."""
    rel, text = _recipe()
    name = Path(rel).stem
    shutil.copytree(ROOT / "src", tmp_path / "src", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "docs").mkdir()
    for page in ("passes.md", "fusion.md"):
        shutil.copy(ROOT / "docs" / page, tmp_path / "docs" / page)
    shutil.copytree(ROOT / "tests" / "passes", tmp_path / "tests")
    (tmp_path / rel).write_text(text)

    first = _probe(tmp_path, name)
    assert name in first["library"]
    assert first["stats"] == {f"{name}.muls": 1}
    assert not first["documented"] and first["untested"] == [f"{Path(rel).parent.name}/{name}"]

    group = Path(rel).parent.name
    (tmp_path / "tests" / group / f"test_{name}.py").write_text("def test_it():\n    pass\n")
    with open(tmp_path / "docs" / "passes.md", "a") as page:
        page.write(f"\n| `{name}` | counts the multiplies | — |\n")
    second = _probe(tmp_path, name)
    assert second["documented"] and second["untested"] == []
