"""Reference kernels of fxpass's fused ops: plain PyTorch, any device, the numerics contract.

Every other kernel (Triton on CUDA) is tested against these. The formulas are the contract
the fusion passes rely on:

* ``rms_norm(x, w, eps, off) = (x.float() * rsqrt(mean(x.float()**2, -1) + eps)
  * (w.float() + off)).to(x.dtype)`` (float64 inputs are computed in float64)
* ``fused_add_rmsnorm(x, r, ...) = (rms_norm(x + r, ...), x + r)``, the sum in ``x``'s dtype
* ``fused_add_rmsnorm_quant(x, r, w, scale, ...) = (clamp(round(normed.float() / scale),
  -128, 127).to(int8), x + r)``

and so is the layout of every result: ``rms_norm``'s is that of an elementwise op on ``x``,
the add ops' results that of ``x + r`` (see :func:`fxpass.fxutil.layout.elementwise_strides`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..fxutil.layout import elementwise_strides, in_layout

__all__ = [
    "fused_add_rmsnorm",
    "fused_add_rmsnorm_quant",
    "quantize_int8",
    "residual_sum",
    "rms_norm",
]


def rms_norm(x: Tensor, weight: Tensor, eps: float, weight_offset: float = 0.0) -> Tensor:
    """RMSNorm over the last dimension, accumulated in float32 (float64 for float64 inputs),
    returned in ``x.dtype``, laid out like ``x`` made dense."""
    acc = _acc_dtype(x)
    h = x.to(acc)  # a sliced x upcasts to a contiguous copy: the layout is restored below
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return in_layout((h * (weight.to(acc) + weight_offset)).to(x.dtype), elementwise_strides(x))


def _acc_dtype(x: Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def fused_add_rmsnorm(
    x: Tensor, residual: Tensor, weight: Tensor, eps: float, weight_offset: float = 0.0
) -> tuple[Tensor, Tensor]:
    """``(rms_norm(x + residual), x + residual)``; the sum is rounded to ``x.dtype`` first."""
    total = residual_sum(x, residual)
    return rms_norm(total, weight, eps, weight_offset), total


def residual_sum(x: Tensor, residual: Tensor) -> Tensor:
    """``x + residual`` in ``x.dtype``, laid out as ``x + residual`` is."""
    return in_layout((x + residual).to(x.dtype), elementwise_strides(x, residual))


def quantize_int8(normed: Tensor, scale: Tensor) -> Tensor:
    """Static per-tensor int8 quantization: ``clamp(round(v / scale), -128, 127)``, laid out
    like ``normed`` made dense."""
    # a 0-d scale: a (1, 1) scale must not broadcast a 1-D input up to two dimensions
    q = torch.clamp(torch.round(normed.float() / scale.reshape(())), -128, 127).to(torch.int8)
    return in_layout(q, elementwise_strides(normed))


def fused_add_rmsnorm_quant(
    x: Tensor,
    residual: Tensor,
    weight: Tensor,
    scale: Tensor,
    eps: float,
    weight_offset: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """``(quantize_int8(rms_norm(x + residual)), x + residual)``."""
    normed, total = fused_add_rmsnorm(x, residual, weight, eps, weight_offset)
    return quantize_int8(normed, scale), total
