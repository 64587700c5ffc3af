"""Every ```python block in README.md and docs/*.md runs, so documentation cannot rot.

Blocks of one file run in order, in one namespace, in a fresh interpreter (so passes a page
registers do not collide with another page's), with a temporary working directory.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def python_blocks(page: Path) -> list[str]:
    return _BLOCK.findall(page.read_text())


def test_docs_have_examples():
    assert any(python_blocks(p) for p in PAGES)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_python_examples_run(page, tmp_path):
    blocks = python_blocks(page)
    if not blocks:
        pytest.skip(f"{page.name} has no python examples")
    script = tmp_path / f"{page.stem}_examples.py"
    parts = [
        f"print('--- block {i} ---', flush=True)\n{block}" for i, block in enumerate(blocks, 1)
    ]
    script.write_text("\n".join(parts))
    proc = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env={**__import__("os").environ, "NO_COLOR": "1"},
    )
    if proc.returncode:
        ran = re.findall(r"--- block (\d+) ---", proc.stdout)
        where = f"block {ran[-1]}" if ran else "before the first block"
        pytest.fail(
            f"{page.name}: example {where} failed\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
        )
