"""The public surface: a curated, sorted __all__ whose every name resolves."""

from __future__ import annotations

import importlib

import pytest

import fxpass
from fxpass._moved import MOVED

MODULES = [
    "fxpass",
    "fxpass.core",
    "fxpass.partition",
    "fxpass.distributed",
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


def test_the_top_level_is_what_a_pass_author_needs():
    # Issue 21: about thirty names; the rest live in their subpackages.
    assert len(fxpass.__all__) <= 34, sorted(fxpass.__all__)


@pytest.mark.parametrize("name", sorted(n for names in MOVED.values() for n in names))
def test_a_moved_name_still_resolves_and_says_where_it_lives(name):
    home = next(h for h, names in MOVED.items() if name in names)
    with pytest.warns(FutureWarning, match=rf"fxpass\.{name} moved to fxpass\."):
        old = getattr(fxpass, name)
    new = fxpass.register if name == "graph_pass" else getattr(importlib.import_module(home), name)
    assert old is new
    assert name not in fxpass.__all__
    if name != "graph_pass":
        assert name in importlib.import_module(home).__all__


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        fxpass.no_such_name  # noqa: B018
