"""The tested torch range, checked when fxpass is imported: older is an error, newer a
warning, both one line that says which versions are supported."""

from __future__ import annotations

import re
import warnings

import pytest
import torch

from fxpass._supported_torch import UntestedTorchWarning, check_torch, supported


@pytest.mark.parametrize("version", ["2.6.0", "2.12.1+cu128", "1.13.1"])
def test_an_older_torch_is_refused(version):
    with pytest.raises(ImportError) as err:
        check_torch(version)
    line = str(err.value)
    assert "\n" not in line and f"this is torch {version}" in line
    assert f"supports torch {supported()}" in line and "pip install 'torch>=2.13,<2.15'" in line


@pytest.mark.parametrize("version", ["2.15.0", "2.16.0.dev20270101+cpu", "3.0.0"])
def test_a_newer_torch_warns_once(version):
    with pytest.warns(UntestedTorchWarning, match=re.escape(f"torch {version} is untested")):
        check_torch(version)


@pytest.mark.parametrize(
    "version", ["2.13.0", "2.13.0+cpu", "2.14.0", "2.14.1+cu130", torch.__version__]
)
def test_a_tested_torch_passes_silently(version):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_torch(version)
