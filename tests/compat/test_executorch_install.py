"""fxpass.compat.executorch.install(): ExecuTorch's own passes and lowering on fxpass.

install() is process-wide and must run before ExecuTorch is imported, so every test here runs
a fresh interpreter. The lowering compared is the docs' model through
``to_edge_transform_and_lower`` with ExecuTorch's XNNPACK partitioner: with install() it must
write the same program, byte for byte, and compute the same outputs in ExecuTorch's runtime.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("executorch.exir")

SRC = Path(__file__).resolve().parents[2] / "src"

_LOWER = """
def lower(out):
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower
    from executorch.runtime import Runtime

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8)
    ).eval()
    x = torch.randn(4, 16)
    lowered = to_edge_transform_and_lower(
        torch.export.export(model, (x,)), partitioner=[XnnpackPartitioner()]
    )
    program = lowered.to_executorch().buffer
    loaded = Runtime.get().load_program(program)  # a Method runs only while its Program lives
    (y,) = loaded.load_method("forward").execute([x])
    torch.testing.assert_close(y, model(x), rtol=1e-5, atol=1e-5)
    open(out + ".pte", "wb").write(program)
    torch.save(y, out + ".pt")


def too_late():
    import fxpass.compat.executorch as fxet

    try:
        fxet.install()
    except RuntimeError as e:
        print("late:", e)
    else:
        raise SystemExit("install() did not fail after passes were defined on ExecuTorch's base")
"""

_WITH_INSTALL = (
    _LOWER
    + """
import sys
import fxpass.compat.executorch as fxet

assert not any(m.startswith("executorch") for m in sys.modules), "the package imported ExecuTorch"
installation = fxet.install()
assert fxet.is_installed() and fxet.install() is not None  # a second install() does nothing
base = fxet.ExportPass  # the first use imports ExecuTorch, which takes fxpass's classes

import executorch.exir.pass_base as pb
import executorch.exir.pass_manager as pm
from executorch.backends.xnnpack._passes.convert_to_linear import ConvertToLinearPass
from executorch.exir.passes.scalar_to_tensor_pass import ScalarToTensorPass

assert pb.ExportPass is fxet.ExportPass is base
assert pm.PassManager is fxet.PassManager
assert pm.ExportedProgramPassManager is fxet.ExportedProgramPassManager
assert issubclass(ScalarToTensorPass, fxet.ExportPass)
assert issubclass(ConvertToLinearPass, fxet.ExportPass)
lower(sys.argv[1])

fxet.uninstall()
assert not fxet.is_installed()
original = pb.ExportPass
assert original is not fxet.ExportPass and original.__module__ == "executorch.exir.pass_base"
assert issubclass(ScalarToTensorPass, fxet.ExportPass)  # defined while installed: stays

with fxet.install():  # ExecuTorch is imported, but no pass is on its own ExportPass yet
    assert pb.ExportPass is fxet.ExportPass
assert pb.ExportPass is original and not fxet.is_installed()

class Mine(pb.ExportPass):  # defined on ExecuTorch's own base: install() now comes too late
    pass

too_late()
"""
)

_WITHOUT_INSTALL = (
    _LOWER
    + """
import sys
lower(sys.argv[1])
too_late()
"""
)


def _run(script: str, *args: str) -> str:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-5000:]
    return proc.stdout


@pytest.fixture(scope="module")
def lowered(tmp_path_factory):
    """The docs' model lowered with and without install(): (stdout, program, outputs) each."""
    import torch

    folder = tmp_path_factory.mktemp("lowered")
    runs = {}
    for kind, script in (("fxpass", _WITH_INSTALL), ("executorch", _WITHOUT_INSTALL)):
        out = str(folder / kind)
        stdout = _run(script, out)
        runs[kind] = (stdout, Path(out + ".pte").read_bytes(), torch.load(out + ".pt"))
    return runs


def test_install_puts_executorchs_passes_and_managers_on_fxpass(lowered):
    stdout, _, _ = lowered["fxpass"]
    late = [line for line in stdout.splitlines() if line.startswith("late:")]
    assert len(late) == 1 and "before ExecuTorch is imported" in late[0], stdout
    assert "__main__.Mine" in late[0]  # the pass defined on ExecuTorch's base is named


def test_the_lowering_writes_the_same_program_with_and_without_install(lowered):
    import torch

    _, program, outputs = lowered["fxpass"]
    _, program_et, outputs_et = lowered["executorch"]
    assert program == program_et
    assert torch.equal(outputs, outputs_et)


def test_install_after_executorch_is_imported_says_what_to_do(lowered):
    stdout, _, _ = lowered["executorch"]
    (late,) = [line for line in stdout.splitlines() if line.startswith("late:")]
    assert "install() must run before ExecuTorch is imported" in late
    assert "fresh interpreter" in late and "passes are already defined" in late


_DURING_IMPORT = """
import importlib.abc, sys

seen = []

class Probe(importlib.abc.MetaPathFinder):
    '''Imports fxpass.compat.executorch as each ExecuTorch module starts running, and uses its
    classes right after ExecuTorch's pass base and pass manager have run.'''

    def find_spec(self, name, path=None, target=None):
        if not name.startswith("executorch.exir"):
            return None
        for finder in sys.meta_path:
            if finder is self:
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None:  # a namespace package: nothing runs
            return spec
        run = spec.loader.exec_module

        def exec_module(module, run=run, name=name):
            import fxpass.compat.executorch as fxet
            run(module)
            if name == "executorch.exir.pass_base":
                seen.append(fxet.ExportPass.__name__)
            if name == "executorch.exir.pass_manager":
                seen.append(fxet.ExportedProgramPassManager.__name__)

        spec.loader.exec_module = exec_module
        return spec

sys.meta_path.insert(0, Probe())
import executorch.exir
from executorch.exir.pass_base import ExportPass
import fxpass.compat.executorch as fxet

assert seen == ["ExportPass", "ExportedProgramPassManager"], seen
assert issubclass(fxet.ExportPass, ExportPass)  # registered as ExecuTorch's
assert fxet.CapabilityPartitioner.__name__ == "CapabilityPartitioner"  # loaded on first use
print("ok")
"""


def test_importable_at_any_point_of_executorchs_own_import():
    assert _run(_DURING_IMPORT).strip().endswith("ok")


def test_the_installation_reads_back():
    from fxpass.compat import executorch as fxet

    assert not fxet.is_installed()  # this process never installed
    assert "uninstalled" in repr(fxet.Installation())
    fxet.uninstall()  # uninstalling when not installed does nothing
    assert not fxet.is_installed()
