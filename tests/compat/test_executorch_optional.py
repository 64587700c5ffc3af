"""fxpass works without ExecuTorch installed; fxpass.compat.executorch says how to get it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"

_WITHOUT_EXECUTORCH = """
import sys

class NoExecuTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "executorch" or name.startswith("executorch."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NoExecuTorch())

import torch
import fxpass, fxpass.compat, fxpass.compat.fx, fxpass.interpret, fxpass.partition
from fxpass.fxutil.dialect import aten_op, edge_op

assert "executorch" not in sys.modules
assert aten_op(torch.ops.aten.add.Tensor) is torch.ops.aten.add.Tensor
result = fxpass.Pipeline.parse("cse,dce").run(torch.fx.symbolic_trace(torch.nn.ReLU()))
assert result.modified is False
for attempt in (lambda: __import__("fxpass.compat.executorch"), lambda: edge_op(torch.ops.aten.add.Tensor)):
    try:
        attempt()
    except ModuleNotFoundError as e:
        print("hint:", e)
    else:
        raise SystemExit("no error without executorch")
"""


def test_fxpass_imports_without_executorch_and_the_compat_module_says_what_to_install():
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(
        [sys.executable, "-c", _WITHOUT_EXECUTORCH],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    hints = [line for line in proc.stdout.splitlines() if line.startswith("hint:")]
    assert len(hints) == 2, proc.stdout
    assert all("pip install executorch==1.5.1" in line for line in hints), hints
