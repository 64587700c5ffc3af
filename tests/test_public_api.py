"""The public surface: a curated, sorted __all__ whose every name resolves."""

from __future__ import annotations

import importlib

import pytest

import fxpass

MODULES = [
    "fxpass",
    "fxpass.compat.fx",
    "fxpass.compat.inductor",
    "fxpass.registry",
    "fxpass.compat.executorch",
]


@pytest.mark.parametrize("name", MODULES)
def test_all_is_sorted_and_resolves(name):
    if name == "fxpass.compat.executorch":
        pytest.importorskip("executorch.exir")  # the executorch extra
    module = importlib.import_module(name)
    assert module.__all__ == sorted(module.__all__), f"{name}.__all__ is not sorted"
    assert len(set(module.__all__)) == len(module.__all__)
    for attr in module.__all__:
        assert hasattr(module, attr), f"{name}.{attr} is in __all__ but missing"


def test_public_names_have_docstrings():
    for attr in fxpass.__all__:
        obj = getattr(fxpass, attr)
        if callable(obj) and not isinstance(obj, type(fxpass)):
            assert obj.__doc__, f"fxpass.{attr} has no docstring"


def test_version():
    assert fxpass.__version__.count(".") == 2
