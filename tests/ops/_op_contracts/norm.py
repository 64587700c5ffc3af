"""Contract entries of the fused RMSNorm ops (``fxpass/ops/norm.py``): every rank from 1 to
4, widths with and without size-one dimensions, x in fp32/bf16/fp16, the weight in x's dtype
or fp32, offsets 0 / 1 (Gemma) / 0.5, residuals in their own layout and dtype, and every
layout of every tensor argument."""

from __future__ import annotations

from typing import Any

import torch
from hypothesis import strategies as st

from fxpass.ops import reference

from . import Call, Contract, in_layout, tensors

_WIDTHS = (1, 2, 7, 16, 33)  # the normalized (last) dimension


@st.composite
def _x_and_weight(draw: Any) -> tuple[torch.Tensor, torch.Tensor, float, float]:
    lead = draw(st.lists(st.integers(1, 4), min_size=0, max_size=3))
    shape = (*lead, draw(st.sampled_from(_WIDTHS)))
    x = draw(tensors(shape))
    w = draw(tensors(shape[-1:], dtypes=(x.dtype, torch.float32)))  # Gemma keeps w in fp32
    eps = draw(st.sampled_from((1e-6, 1e-5)))
    offset = draw(st.sampled_from((0.0, 1.0, 0.5)))  # 1.0: Gemma's (1 + w)
    return x, w, eps, offset


@st.composite
def _residual_for(draw: Any, x: torch.Tensor) -> torch.Tensor:
    return draw(tensors(tuple(x.shape), dtypes=(x.dtype, torch.float32)))


@st.composite
def _scale(draw: Any) -> torch.Tensor:
    shape = draw(st.sampled_from(((1,), (), (1, 1))))
    return torch.full(shape, draw(st.sampled_from((0.01, 0.02, 0.5))))


@st.composite
def _rms_norm_calls(draw: Any) -> Call:
    x, w, eps, offset = draw(_x_and_weight())
    return Call((x, w, eps, offset))


@st.composite
def _fused_add_calls(draw: Any, quant: bool = False) -> Call:
    x, w, eps, offset = draw(_x_and_weight())
    r = draw(_residual_for(x))
    if quant:
        return Call((x, r, w, draw(_scale()), eps, offset))
    return Call((x, r, w, eps, offset))


def _examples(n_inputs: int, grad: bool | None = True, extra: tuple = ()) -> list[Call]:
    """Two fp32 calls for opcheck that between them use every layout: x transposed with
    Gemma's offset and a sliced residual; x expanded (sliced for an in-place op, which
    cannot write into an expanded view) with a contiguous residual and a sliced weight."""
    first = ("transposed", "sliced", "contiguous", 1.0)
    second = ("sliced" if grad is None else "expanded", "contiguous", "sliced", 0.0)
    calls = []
    for i, (x_layout, r_layout, w_layout, offset) in enumerate((first, second)):
        layouts = (x_layout, r_layout)[:n_inputs]
        xs = [
            in_layout((3, 5, 16), torch.float32, lay, seed=i + k) for k, lay in enumerate(layouts)
        ]
        w = in_layout((16,), torch.float32, w_layout, seed=9)
        for t in (*xs, w):
            t.requires_grad_(bool(grad))
        calls.append(Call((*xs, w, *extra, 1e-6, offset)))
    return calls


def _in_place_reference(call: Call) -> tuple[torch.Tensor, torch.Tensor]:
    x, r = call.args[:2]
    normed, total = reference.fused_add_rmsnorm(*call.args)
    # what the op leaves in x and residual: the results, in the arguments' own layouts
    return _like(normed, x), _like(total, r)


def _like(value: torch.Tensor, arg: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(arg.shape, arg.stride(), dtype=arg.dtype).copy_(value)


CONTRACTS = {
    "fxpass::rms_norm": Contract(
        calls=_rms_norm_calls(),
        examples=lambda: _examples(1),
        reference=lambda call: reference.rms_norm(*call.args),
    ),
    "fxpass::fused_add_rmsnorm": Contract(
        calls=_fused_add_calls(),
        examples=lambda: _examples(2),
        reference=lambda call: reference.fused_add_rmsnorm(*call.args),
    ),
    "fxpass::fused_add_rmsnorm_quant": Contract(
        calls=_fused_add_calls(quant=True),
        # opcheck's AOT test cannot sum an int8 output into a float loss: no grads there
        examples=lambda: _examples(2, grad=False, extra=(torch.tensor([0.02]),)),
        reference=lambda call: reference.fused_add_rmsnorm_quant(*call.args),
    ),
    "fxpass::fused_add_rmsnorm_": Contract(
        calls=_fused_add_calls(),
        examples=lambda: _examples(2, grad=None),
        reference=_in_place_reference,
        observed=lambda call, out: call.args[:2],
    ),
}
