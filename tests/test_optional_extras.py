"""Tests that need an optional extra skip, with the reason, where it is not installed.

Each case runs test files in a fresh pytest with the extra made unimportable
(``tests/_without_extras.py``): nothing may fail or error, and the tests that need it must
say which package they skipped for."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent

# (package made unimportable, test files, -k selection, at least this many skipped for it)
CASES = [
    (
        "executorch",
        [
            "rewrite/test_pattern.py",
            "rewrite/test_driver.py",
            "fxutil/test_views.py",
            "partition/test_edge_partitions.py",
            "passes/test_edge.py",
            "compat/test_policy.py",
        ],
        "edge or executorch or views",
        5,
    ),
    ("triton", ["ops/test_triton_norm.py"], "", 1),
]


@pytest.mark.parametrize(("package", "files", "select", "skips"), CASES, ids=[c[0] for c in CASES])
def test_tests_skip_with_the_reason_where_an_extra_is_missing(package, files, select, skips):
    env = {k: v for k, v in os.environ.items() if k != "CI"}  # CI fails on a missing extra
    env["FXPASS_TEST_WITHOUT"] = package
    paths = [str(TESTS), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    args = [sys.executable, "-m", "pytest", "-p", "_without_extras", "-p", "no:cacheprovider",
            "-q", "-rs", *(["-k", select] if select else []), *(str(TESTS / f) for f in files)]  # fmt: skip
    proc = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    summary = out.strip().splitlines()[-1]
    assert proc.returncode in (0, 5), out[-4000:]  # 5: everything was skipped or deselected
    assert not re.search(r"\d+ (failed|error)", summary), out[-4000:]
    reasons = [ln for ln in out.splitlines() if ln.startswith("SKIPPED")]
    counted = sum(
        int(m.group(1)) if (m := re.match(r"SKIPPED \[(\d+)\]", ln)) else 1
        for ln in reasons
        if package in ln
    )
    assert counted >= skips, out[-4000:]
