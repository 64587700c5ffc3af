"""Tolerances: never negative (a negative one fails equal values with error 0)."""

from __future__ import annotations

import math

import pytest
import torch

from fxpass.verify.compare import compare_outputs, tolerance_for


@pytest.mark.parametrize("rtol, atol", [(-1.0, None), (None, -1e-3), (math.nan, None)])
def test_a_negative_tolerance_is_refused(rtol, atol):
    x = torch.ones(3)
    with pytest.raises(ValueError, match="must be a number >= 0"):
        compare_outputs(x, x, rtol=rtol, atol=atol)
    with pytest.raises(ValueError, match="must be a number >= 0"):
        tolerance_for(torch.float32, rtol, atol)


def test_zero_tolerances_compare_exactly():
    x = torch.ones(3)
    assert compare_outputs(x, x, rtol=0, atol=0).ok
    assert not compare_outputs(x, x + 1e-6, rtol=0, atol=0).ok
