"""fxpass's torch plug-in: a fused program loads with plain ``torch.export.load`` in a process
that never imported fxpass, and ``import torch`` alone imports none of fxpass."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import fxpass as fp

_hf = pytest.importorskip("_hf")

# A consumer of the program: knows transformers (the program returns its output type),
# never imports fxpass, runs the program on the saved inputs and saves what it returned.
CONSUMER = """
import sys
import torch
import transformers.modeling_outputs  # the program returns a CausalLMOutputWithPast
assert "fxpass" not in sys.modules
ep = torch.export.load(sys.argv[1])
ids = torch.load(sys.argv[2])
torch.save(ep.module()(ids).logits, sys.argv[3])
print("fxpass imported by the plug-in:", "fxpass" in sys.modules)
"""


def _run(code: str, *args: str, env: dict[str, str] | None = None):
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, **(env or {})},
    )


@pytest.fixture(scope="module")
def fused_hf(tmp_path_factory) -> tuple[Path, Path, torch.Tensor]:
    """A fused tiny Hugging Face Llama saved as .pt2, its inputs, and its logits here."""
    folder = tmp_path_factory.mktemp("autoload")
    result = fp.apply(_hf.exported("llama"))
    fused = {str(n.target) for n in result.graph_module.graph.nodes}
    assert "fxpass.fused_add_rmsnorm.default" in fused
    ids = _hf.example_inputs(1)[0]
    torch.export.save(result.program, folder / "fused.pt2")
    torch.save(ids, folder / "ids.pt")
    with torch.no_grad():
        logits = result.program.module()(ids).logits
    return folder / "fused.pt2", folder / "ids.pt", logits


def test_a_fused_program_loads_where_fxpass_was_never_imported(fused_hf, tmp_path):
    program, ids, logits = fused_hf
    out = tmp_path / "logits.pt"
    proc = _run(CONSUMER, str(program), str(ids), str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "fxpass imported by the plug-in: True" in proc.stdout
    torch.testing.assert_close(torch.load(out), logits, rtol=0, atol=0)


def test_without_the_plug_in_torch_cannot_resolve_the_fused_op(fused_hf, tmp_path):
    """The control: with torch's plug-ins turned off, the same load fails on the fused op."""
    program, ids, _ = fused_hf
    proc = _run(
        CONSUMER, str(program), str(ids), str(tmp_path / "x.pt"),
        env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"},
    )  # fmt: skip
    assert proc.returncode != 0
    assert "Traceback" in proc.stderr and "error when deserializing" in proc.stderr


def test_import_torch_imports_nothing_of_fxpass():
    proc = _run(
        "import sys, torch; print(sorted(m for m in sys.modules if m.startswith('fxpass')))"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "['fxpass_autoload']"


def test_saved_programs_name_the_ops_as_torch_does(tmp_path):
    """The plug-in's namespace must not leak its own module name into saved programs."""
    import fxpass_autoload

    assert type(torch.ops.fxpass).__module__ == "torch._ops"
    assert torch.ops.fxpass.rms_norm.default.__module__ == "torch._ops.fxpass"
    assert fxpass_autoload._state["started"] or "fxpass" in sys.modules


def test_install_is_harmless_when_the_namespace_exists():
    import fxpass_autoload

    before = vars(torch.ops)["fxpass"]
    fxpass_autoload.install()
    assert vars(torch.ops)["fxpass"] is before
    assert torch.ops.fxpass.rms_norm(torch.ones(2, 4), torch.ones(4), 1e-6).shape == (2, 4)
