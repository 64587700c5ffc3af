"""Every ``>>>`` example in fxpass's docstrings runs as a doctest and prints what it shows.

An example that needs what a docstring cannot build in a line or two (a model, ranks, a
file, a pass that is running) carries ``# doctest: +SKIP``; every other one runs. Flags:
``ELLIPSIS`` (``...`` stands for a timing or a location) and ``NORMALIZE_WHITESPACE``.

They run in one fresh interpreter, not in the test process: examples register passes and
analyses, and install Inductor's pattern matcher, which must not leak into other tests.
"""

from __future__ import annotations

import doctest
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src" / "fxpass"
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
# Skipped examples are not counted; this many must run, so SKIP stays the exception.
MIN_RUN = 100


def modules_with_examples() -> list[str]:
    """The fxpass modules whose source has a ``>>>`` example."""
    names = []
    for path in sorted(SRC.rglob("*.py")):
        if ">>>" in path.read_text():
            parts = path.relative_to(SRC.parent).with_suffix("").parts
            names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def run_all() -> dict:
    """Run every module's doctests; failures are reported on stdout as doctest reports them."""
    attempted = failed = 0
    failing = []
    for name in modules_with_examples():
        module = importlib.import_module(name)
        runner = doctest.DocTestRunner(optionflags=FLAGS)
        for test in doctest.DocTestFinder().find(module, name):
            runner.run(test, out=sys.__stdout__.write)
        result = runner.summarize(verbose=False)
        attempted, failed = attempted + result.attempted, failed + result.failed
        if result.failed:
            failing.append(name)
    return {"attempted": attempted, "failed": failed, "failing": failing}


def test_modules_with_examples_are_found():
    names = modules_with_examples()
    assert "fxpass.rewrite.pattern" in names and "fxpass.ops" in names
    assert len(names) > 40


def test_docstring_examples_pass():
    proc = subprocess.run(
        [sys.executable, __file__],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_COLOR": "1"},
    )
    lines = proc.stdout.rstrip().splitlines()
    assert proc.returncode == 0 and lines, f"the doctest run failed:\n{proc.stderr[-5000:]}"
    summary = json.loads(lines[-1])
    report = "\n".join(lines[:-1])
    assert not summary["failed"], (
        f"{summary['failed']} docstring examples failed in {summary['failing']}:\n{report}"
    )
    assert summary["attempted"] >= MIN_RUN, (
        f"only {summary['attempted']} docstring examples ran (the rest are +SKIP); "
        f"at least {MIN_RUN} should"
    )


if __name__ == "__main__":
    print(json.dumps(run_all()))
