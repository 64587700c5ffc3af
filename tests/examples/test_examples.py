"""The examples in examples/ run and show what they promise."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent.parent / "examples"

EXPECTED = {
    "torch_tensorrt_style.py": [
        "pass list 'aten_lowering' (3 passes):",
        "report_inputs_example saw sample inputs of shapes [(1, 8)]",
        "----- after (147 nodes) -----",
        "removed 'report_inputs_example'",
    ],
    "torch_fx_infra_style.py": [
        "reciprocal_default = torch.ops.aten.reciprocal.default(sqrt_default)",
        "modified=True; rounds run: 9 of 20",
    ],
    "executorch_style.py": [
        "An error occurred when running the 'ReplaceDivWithMul' pass after the following "
        "passes: ['ReplaceAddPass']",
        "because: ValueError: this backend cannot run torch.mul",
        "----- after the failed run (unchanged) -----\ndef forward(self, x, y):\n"
        "    add = torch.add(x, y)",
        "add = torch.div(x, y)",
    ],
    "tensor_parallel.py": [
        "layers.0.self_attn.q_proj.weight: column -- column-parallel",
        "50.3%",
        "rank 0 of 2: logits (1, 8, 128), matches one process",
        "rank 1 of 2: logits (1, 8, 128), matches one process",
    ],
    "sglang_style.py": [
        "torch.ops.fxpass.fused_add_rmsnorm.default",
        "EraseAsserts",
        "AddRmsNormFuse",
    ],
}


def test_every_example_is_tested():
    assert sorted(p.name for p in EXAMPLES.glob("[!_]*.py")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_example_runs(name):
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / name)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for expected in EXPECTED[name]:
        assert expected in proc.stdout, f"{name} did not print {expected!r}:\n{proc.stdout}"
