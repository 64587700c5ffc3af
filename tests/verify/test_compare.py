"""Tolerances: never negative (a negative one fails equal values with error 0); the float32
run that tells bf16 rounding from a wrong rewrite, and what a comparison says without it."""

from __future__ import annotations

import math

import pytest
import torch
from torch import fx, nn

from fxpass.verify.compare import (
    ReferenceUnavailable,
    compare_outputs,
    run_graph_promoted,
    tolerance_for,
)
from fxpass.verify.numerics import verify_numerics


def bf16_kernel(x):
    """A kernel with a fixed dtype contract: the float32 run of a graph calling it fails."""
    if x.dtype != torch.bfloat16:
        raise TypeError(f"bf16_kernel takes bfloat16, not {x.dtype}")
    return x * 3


fx.wrap("bf16_kernel")


class _Scaled(nn.Module):
    def __init__(self, shift: float = 0.0):
        super().__init__()
        self.shift = shift

    def forward(self, x):
        return bf16_kernel(x) + self.shift


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


def test_a_float32_run_that_fails_is_reported_not_lost():
    gm = fx.symbolic_trace(_Scaled())
    x = torch.randn(64, dtype=torch.bfloat16)
    truth = run_graph_promoted(gm, [x])
    assert isinstance(truth, ReferenceUnavailable)
    assert "TypeError: bf16_kernel takes bfloat16, not torch.float32" in truth.why
    expected = gm(x)
    cmp = compare_outputs([expected], [expected + 0.5], truth=truth)
    assert not cmp.ok and cmp.worst.no_reference == truth.why
    assert "whether this is bfloat16 rounding or a wrong rewrite is unknown" in cmp.summary()
    assert cmp.to_dict()["no_reference"] == cmp.to_dict()["failures"][0]["no_reference"]
    ok = compare_outputs([expected], [expected], truth=truth)
    assert ok.ok  # nothing to forgive, and the summary says what was missing
    assert f"no float32 reference ({truth.why})" in ok.summary()


def test_verify_numerics_says_the_yardstick_is_missing():
    x = torch.randn(64, dtype=torch.bfloat16)
    cmp = verify_numerics(fx.symbolic_trace(_Scaled()), fx.symbolic_trace(_Scaled(0.5)), [x])
    assert not cmp.ok
    assert "the float32 run of the original failed (TypeError: bf16_kernel" in str(cmp)


def test_a_graph_without_low_precision_needs_no_float32_run():
    gm = fx.symbolic_trace(nn.ReLU())
    assert run_graph_promoted(gm, [torch.randn(4)]) is None


class _NoGrad(nn.Module):
    """bf16 math under ``torch.no_grad()``: export wraps it in ``wrap_with_set_grad_enabled``
    around a subgraph, as it does Hugging Face's rotary embeddings."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, dtype=torch.bfloat16))

    def forward(self, x):
        with torch.no_grad():
            y = (x * self.w).exp()
        return y * 3.0


def test_subgraphs_of_higher_order_ops_run_in_float32_too():
    """The float32 run reaches into subgraphs; it failed on their bf16 dtype checks before."""
    torch.manual_seed(0)
    model, x = _NoGrad(), torch.randn(8, dtype=torch.bfloat16)
    ep = torch.export.export(model, (x,))
    assert any("wrap_with_set_grad_enabled" in str(n.target) for n in ep.graph.nodes)
    truth = run_graph_promoted(ep.module(), [x])
    assert isinstance(truth, list), truth
    (out,) = truth
    assert out.dtype == torch.float32
    exact = (x.double() * model.w.detach().double()).exp() * 3.0
    assert torch.allclose(out.double(), exact, rtol=1e-6)
    assert not torch.equal(out.double(), model(x).double())  # not the bf16 result again


class _Branches(nn.Module):
    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda x: (x * 2).exp(), lambda x: (x - 1).exp(), (x,))


def test_the_branches_of_cond_run_in_float32_too():
    x = torch.randn(8, dtype=torch.bfloat16)
    ep = torch.export.export(_Branches(), (x,))
    (out,) = run_graph_promoted(ep.module(), [x])
    xd = x.double()
    exact = (xd * 2).exp() if xd.sum() > 0 else (xd - 1).exp()
    assert out.dtype == torch.float32
    assert torch.allclose(out.double(), exact, rtol=1e-6)
