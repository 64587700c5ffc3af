"""ExecuTorch's own tests of its pass infrastructure, run on fxpass.compat.executorch.

The test module shipped with ``executorch`` (``exir/tests/test_pass_infra.py``) is loaded with
its two imports of ``executorch.exir.pass_base`` and ``executorch.exir.pass_manager`` pointed
at ``fxpass.compat.executorch`` — the one change a backend author makes — and every test in it
runs here.
"""

from __future__ import annotations

import importlib.util
import sys
import types
import unittest

import pytest

pytest.importorskip("executorch.exir")

_IMPORTS = {
    "from executorch.exir.pass_base import (": "from fxpass.compat.executorch import (",
    "from executorch.exir.pass_manager import ": "from fxpass.compat.executorch import ",
}


def _upstream() -> types.ModuleType:
    spec = importlib.util.find_spec("executorch.exir.tests.test_pass_infra")
    assert spec is not None and spec.origin, "executorch ships exir/tests/test_pass_infra.py"
    with open(spec.origin, encoding="utf-8") as f:
        source = f.read()
    for old, new in _IMPORTS.items():
        assert source.count(old) == 1, f"the upstream test no longer imports {old!r} once"
        source = source.replace(old, new)
    module = types.ModuleType("executorch_test_pass_infra_on_fxpass")
    module.__file__ = spec.origin
    sys.modules[module.__name__] = module  # its test functions name it as their module
    exec(compile(source, spec.origin, "exec"), module.__dict__)
    return module


_MODULE = _upstream()


def test_the_upstream_tests_use_fxpass():
    from fxpass.compat import executorch as compat

    assert _MODULE.ExportPass is compat.ExportPass
    assert _MODULE.PassManager is compat.PassManager
    assert _MODULE.ExportedProgramPassManager is compat.ExportedProgramPassManager


globals().update(
    (name, obj)
    for name, obj in vars(_MODULE).items()
    if isinstance(obj, type) and issubclass(obj, unittest.TestCase) and name.startswith("Test")
)


# ----- ExecuTorch's own pass tests with install() ---------------------------------------------
# install() swaps ExecuTorch's classes process-wide before ExecuTorch is imported: ExecuTorch's
# tests then run on fxpass unchanged (their passes, managers and lowering included), in a
# fresh interpreter. Run once in full (FXPASS_EXECUTORCH_UPSTREAM=all, about 5 minutes here):
# with and without install() the same 90 tests pass (73 of test_passes.py, 17 of
# test_pass_infra.py) and the same 17 fail (below), as without it.
#
# Failing without install() too, in this environment (deselected):
_FAIL_WITHOUT_INSTALL = {
    # torchao's XNNPACK quantizer now emits two quantize ops where the test expects one
    "test_passes.py::TestPasses::test_to_edge_quantized_dropout": "16 subtests",
    # needs ExecuTorch's test-only op library (my_awesome_3rdparty_ns), not in the wheel
    "test_passes.py::TestPasses::test_to_out_variant_none_output": "",
}
# Left to the full run to keep the suite's time: the slowest tests (1.5 to 60 s each here,
# together about 3.5 minutes; all pass with install()): quantization, delegation, control-flow
# and memory-planning flows end to end. The 44 that stay (about 40 s) still run ExecuTorch's
# Edge passes, CSE, constant propagation, spec propagation, debug handles, dim-order and
# out-variant passes through its managers — on fxpass.
_SLOW = (
    "test_to_edge_quantized_dropout",
    "test_constant_prop_pass_after_delegation",
    "test_remove_mixed_type_operators",
    "test_remove_quantized_op_noop_pass",
    "test_compile_fix_broken_ops",
    "test_spec_prop_pass_while",
    "test_spec_prop_pass_scan",
    "test_spec_prop_pass_scan_dynamic_shape",
    "test_spec_prop_pass_cond",
    "test_alloc_node_spec",
    "test_redundant_slice_copy_removal",
    "test_to_out_var_dynamic_alloc_uses_concrete_upper_bounds",
    "test_to_out_variant_to_copy",
    "test_constant_prop_pass_for_no_grad",
    "test_arange",
    "test_duplicate_unary_ops_deduplicated",
    "test_remove_mixed_types_symfloats",
    "test_spec_prop_pass_unbacked_symint",
    "test_backend_fused_op_retraceable",
    "test_dim_order_revert_pass",
    "test_symint_conversion",
    "test_spec_prop_pass_tuple_output",
    "test_constant_prop_pass_for_control_flow",
    "test_to_out_variant_singleon_tensor_list",
    "test_constant_prop_pass_for_mutable_buffers",
    "test_to_out_variant_multiple_out",
    "test_to_edge_with_edge_ops",
    "test_replace_slice",
    "test_noop_when_no_duplicates",
    "test_clone_no_kwarg_preserves_channels_last_dim_order",
)
_RUN_INSTALLED = """
import sys
import fxpass.compat.executorch as fxet
fxet.install()
import executorch.exir.pass_base as pass_base
import pytest
code = pytest.main(sys.argv[1:])
print("ExportPass from", pass_base.ExportPass.__module__)
sys.exit(code)
"""


def test_executorchs_own_pass_tests_pass_with_install(tmp_path):
    import os
    import re
    import subprocess
    from pathlib import Path

    folder = Path(importlib.util.find_spec("executorch.exir.tests.test_pass_infra").origin).parent
    args = [str(folder / "test_pass_infra.py"), str(folder / "test_passes.py")]
    left_out = [name.rsplit("::", 1)[1] for name in _FAIL_WITHOUT_INSTALL]
    if os.environ.get("FXPASS_EXECUTORCH_UPSTREAM") != "all":
        left_out += _SLOW
    args += ["-k", " and ".join(f"not {name}" for name in left_out)]
    src = Path(__file__).resolve().parents[2] / "src"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")]),
    }
    options = ["-q", "-p", "no:cacheprovider", "-x", "--rootdir", str(tmp_path)]
    proc = subprocess.run(
        [sys.executable, "-c", _RUN_INSTALLED, *options, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=1200,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert "ExportPass from fxpass.compat.executorch._pass_base" in proc.stdout, out[-2000:]
    passed = re.search(r"(\d+) passed", proc.stdout)
    assert passed and int(passed[1]) >= 50 and " failed" not in proc.stdout, out[-2000:]
