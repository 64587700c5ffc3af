"""The Triton kernels of the fused norm ops run on every test run: Triton's CPU interpreter.

Triton is in the test extra. It chooses to compile or to interpret a kernel when
``@triton.jit`` runs (it reads ``TRITON_INTERPRET`` then, at the import of
``fxpass.ops._triton_norm``), so the cases (``_triton_interpreted.py``: every dtype, row width
— the two-pass path included — and layout) run in a subprocess that has the variable from
its start: no other test sees it, and no kernel imported earlier in this process is affected.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

CASES = Path(__file__).with_name("_triton_interpreted.py")
SRC = Path(__file__).resolve().parents[2] / "src"


def test_the_kernels_are_checked_by_the_interpreter():
    if not sys.platform.startswith("linux"):
        pytest.skip("Triton ships for Linux only")
    if importlib.util.find_spec("triton") is None:
        message = (
            "needs triton (in the test extra: pip install -e '.[test]'); without it the "
            "kernels of the fused ops are not checked"
        )
        if os.environ.get("CI"):  # CI installs the test extra: there a missing triton is a bug
            pytest.fail(message)
        pytest.skip(message)
    env = {
        **os.environ,
        "TRITON_INTERPRET": "1",
        "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(
        [sys.executable, str(CASES)], env=env, capture_output=True, text=True, timeout=600
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    # 3 dtypes x (3 row widths + 4 layouts), all run, none skipped
    summary = re.search(r"^(\d+) of (\d+) cases passed$", proc.stdout, re.M)
    assert summary and summary[1] == summary[2] and int(summary[2]) >= 21, out[-3000:]
