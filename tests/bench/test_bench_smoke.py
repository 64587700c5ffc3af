"""Every benchmark still runs (with --quick: small sizes). Timings are printed, never asserted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent.parent / "bench"
SCRIPTS = sorted(p.name for p in BENCH.glob("[!_]*.py"))
#: inductor.py --vllm builds and uses the vLLM environment: on the xdist worker of the vLLM
#: tests (tests/conftest.py's "vllm" group), so neither worker waits on the other's build lock
PARAMS = [
    pytest.param(s, marks=pytest.mark.xdist_group("vllm")) if s == "inductor.py" else s
    for s in SCRIPTS
]


def test_benchmarks_exist():
    assert "pipeline_overhead.py" in SCRIPTS
    assert "executorch.py" in SCRIPTS  # ExecuTorch's lowering with and without install()
    assert "executorch_pass.py" in SCRIPTS  # ExportPass against ExecuTorch's, pass for pass
    assert "cost.py" in SCRIPTS  # what each command costs against its anchor (issue 31)


@pytest.mark.parametrize("script", PARAMS)
def test_benchmark_runs_quick(script):
    if script.startswith("executorch"):
        pytest.importorskip("executorch.exir")
    extra = ["--phases"] if script == "executorch.py" else []  # its phase table too
    if script == "inductor.py":
        extra = ["--vllm"]  # vLLM's own passes too (in .venv-vllm, tools/vllm_env.py)
    proc = subprocess.run(
        [sys.executable, str(BENCH / script), "--quick", "--repeat", "1", *extra],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, f"{script} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    out = proc.stdout.lower()
    assert "ratio" in out or "speedup" in out, f"{script} printed no ratio:\n{proc.stdout}"
    if script == "executorch.py":
        assert "xnnpack's passes on each delegate" in out, proc.stdout
    if script == "inductor.py":
        assert "vllm 0.32.0's own passes" in out or "skipped, the vllm environment" in out
    if script == "shard.py":  # per layer against the minimum; launches before/after bucketing
        assert "communication per layer" in out and "launches per forward" in out, proc.stdout
        assert "1 more all-reduce of partial sums" in out, proc.stdout  # the MoE's shared expert
    if script == "cost.py":  # every row, each with its ratio and its target
        lines = proc.stdout.splitlines()
        rows = [line for line in lines if line.startswith("(") and "skipped" not in line]
        for row in ["(a)", "(b)", "(c)", "(d)"]:
            assert any(line.startswith(row) and "ratio" in line for line in rows), proc.stdout
        assert all("target" in line or "meets" in line or "MISSES" in line for line in rows)
