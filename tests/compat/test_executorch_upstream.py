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
