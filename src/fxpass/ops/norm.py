"""The fused RMSNorm ops, registered with ``torch.library`` under the ``fxpass`` namespace.

=================================  ==========================================================
op                                 schema
=================================  ==========================================================
``fxpass::rms_norm``               ``(Tensor x, Tensor weight, float eps,
                                   float weight_offset=0.0) -> Tensor``
``fxpass::fused_add_rmsnorm``      ``(Tensor x, Tensor residual, Tensor weight, float eps,
                                   float weight_offset=0.0) -> (Tensor, Tensor)``
``fxpass::fused_add_rmsnorm_quant``  ``(Tensor x, Tensor residual, Tensor weight, Tensor scale,
                                   float eps, float weight_offset=0.0) -> (Tensor, Tensor)``
``fxpass::fused_add_rmsnorm_``     ``(Tensor(a!) x, Tensor(b!) residual, Tensor weight,
                                   float eps, float weight_offset=0.0) -> ()``
=================================  ==========================================================

Each op has a fake kernel (shapes, dtypes and strides, so torch.export, AOTAutograd and
Dynamo trace through it), a decomposition into torch's own ops (at the end of this file; what
``fxpass run --portable`` writes, see :mod:`fxpass.ops.portable`), a reference kernel (:mod:`fxpass.ops.reference`, every device; on CPU
ATen's fused ``rms_norm`` where it computes the same thing) and, on
CUDA, a Triton kernel (:mod:`fxpass.ops._triton_norm`) picked at run time when Triton is
installed and the dtype is float16, bfloat16 or float32. The out-of-place ops are
differentiable (the int8 output of the quantizing op has a zero gradient).

Layout (the same in every kernel, the fake one included, and in the gradients): each output
has the layout an elementwise op on the inputs would give
(:func:`fxpass.fxutil.layout.elementwise_strides`) — ``rms_norm``'s that of ``x``, the
add ops' outputs that of ``x + residual`` — which is what the unfused ATen ops produce for
dense inputs, so views traced downstream of a replaced norm stay valid. Each input's
gradient has that input's layout, made dense.
"""

from __future__ import annotations

import functools
import os
from types import ModuleType

import torch
from torch import Tensor

from ..fxutil.layout import elementwise_strides, empty_elementwise, in_layout
from . import reference
from .portable import decomposes

__all__ = [
    "fused_add_rmsnorm",
    "fused_add_rmsnorm_",
    "fused_add_rmsnorm_quant",
    "kernel_for",
    "rms_norm",
]

_TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


# ----- argument checks (shared by fake and real kernels, so errors surface at trace time) --
def _check_norm(op: str, x: Tensor, weight: Tensor) -> None:
    torch._check(
        x.is_floating_point(), lambda: f"fxpass.{op}: x must be a floating tensor, not {x.dtype}"
    )
    torch._check(x.dim() >= 1, lambda: f"fxpass.{op}: x must have at least one dimension")
    torch._check(
        weight.dim() == 1 and weight.shape[0] == x.shape[-1],
        lambda: (
            f"fxpass.{op}: weight must be 1-D with x's last dimension "
            f"({x.shape[-1]} elements), got shape {tuple(weight.shape)}"
        ),
    )


def _check_residual(op: str, x: Tensor, residual: Tensor) -> None:
    torch._check(
        residual.shape == x.shape,
        lambda: (
            f"fxpass.{op}: residual must have x's shape {tuple(x.shape)}, got "
            f"{tuple(residual.shape)} (broadcast adds are not fused)"
        ),
    )


def _check_scale(op: str, scale: Tensor) -> None:
    torch._check(
        scale.numel() == 1 and scale.is_floating_point(),
        lambda: (
            f"fxpass.{op}: scale must be a one-element float tensor (static per-tensor "
            f"int8 quantization), got shape {tuple(scale.shape)} and dtype {scale.dtype}"
        ),
    )


# ----- kernel choice on CUDA -------------------------------------------------------------
@functools.cache
def _triton() -> ModuleType | None:
    if os.environ.get("FXPASS_DISABLE_TRITON"):
        return None
    try:
        from . import _triton_norm
    except ImportError:  # no Triton: the reference kernel runs on the GPU instead
        return None
    return _triton_norm


def kernel_for(x: Tensor) -> str:
    """Which kernel the ops run for an input like ``x``: ``"triton"`` or ``"reference"``.

    Set the environment variable ``FXPASS_DISABLE_TRITON=1`` (before the first call) to
    force the reference kernel on CUDA.
    """
    ok = x.is_cuda and x.dtype in _TRITON_DTYPES and _triton() is not None
    return "triton" if ok else "reference"


def _rms_norm_cpu(x: Tensor, weight: Tensor, eps: float, weight_offset: float) -> Tensor:
    """The reference formula; ATen's fused ``rms_norm`` where it computes exactly that (same
    dtypes, no offset: it accumulates in float32 and rounds once), about 3x faster on CPU.
    ATen's kernel returns a contiguous tensor whatever ``x``'s layout: it is copied into the
    op's layout where that differs."""
    if weight_offset == 0.0 and weight.dtype == x.dtype and x.dtype in _TRITON_DTYPES:
        out = torch.rms_norm(x, (x.shape[-1],), weight, eps)
        return in_layout(out, elementwise_strides(x))
    return reference.rms_norm(x, weight, eps, weight_offset)


def _fused_add_cpu(x, residual, weight, eps, weight_offset) -> tuple[Tensor, Tensor]:
    total = reference.residual_sum(x, residual)
    return _rms_norm_cpu(total, weight, eps, weight_offset), total


def _check_writable(op: str, name: str, t: Tensor) -> None:
    # an expanded view shares memory between elements: writing into it is not defined
    torch._check(
        torch._debug_has_internal_overlap(t) != 1,
        lambda: (
            f"fxpass.{op}: {name} is an expanded view (several elements share memory) and "
            f"cannot be written in place; pass {name}.clone() or use the out-of-place op"
        ),
    )


# ----- fxpass::rms_norm ------------------------------------------------------------------
@torch.library.custom_op(
    "fxpass::rms_norm",
    mutates_args=(),
    schema="(Tensor x, Tensor weight, float eps, float weight_offset=0.0) -> Tensor",
)
def rms_norm(x: Tensor, weight: Tensor, eps: float, weight_offset: float = 0.0) -> Tensor:
    """RMSNorm over the last dimension in float32: ``(x * rsqrt(mean(x²) + eps) *
    (weight + weight_offset)).to(x.dtype)``, laid out like ``x`` (made dense)."""
    _check_norm("rms_norm", x, weight)
    return _rms_norm_cpu(x, weight, eps, weight_offset)


@rms_norm.register_fake
def _(x, weight, eps, weight_offset=0.0):
    _check_norm("rms_norm", x, weight)
    return empty_elementwise(x)


@rms_norm.register_kernel("cuda")
def _(x, weight, eps, weight_offset=0.0):
    _check_norm("rms_norm", x, weight)
    if kernel_for(x) != "triton":
        return reference.rms_norm(x, weight, eps, weight_offset)
    out = empty_elementwise(x)
    _triton().launch(x, None, weight, eps, weight_offset, out)
    return out


# ----- fxpass::fused_add_rmsnorm ---------------------------------------------------------
@torch.library.custom_op(
    "fxpass::fused_add_rmsnorm",
    mutates_args=(),
    schema="(Tensor x, Tensor residual, Tensor weight, float eps, float weight_offset=0.0)"
    " -> (Tensor, Tensor)",
)
def fused_add_rmsnorm(
    x: Tensor, residual: Tensor, weight: Tensor, eps: float, weight_offset: float = 0.0
) -> tuple[Tensor, Tensor]:
    """``(rms_norm(x + residual), x + residual)``: the residual add fused into the norm. Both
    results are laid out like ``x + residual``."""
    _check_norm("fused_add_rmsnorm", x, weight)
    _check_residual("fused_add_rmsnorm", x, residual)
    return _fused_add_cpu(x, residual, weight, eps, weight_offset)


@fused_add_rmsnorm.register_fake
def _(x, residual, weight, eps, weight_offset=0.0):
    _check_norm("fused_add_rmsnorm", x, weight)
    _check_residual("fused_add_rmsnorm", x, residual)
    return empty_elementwise(x, residual), empty_elementwise(x, residual)


@fused_add_rmsnorm.register_kernel("cuda")
def _(x, residual, weight, eps, weight_offset=0.0):
    _check_norm("fused_add_rmsnorm", x, weight)
    _check_residual("fused_add_rmsnorm", x, residual)
    if kernel_for(x) != "triton":
        return reference.fused_add_rmsnorm(x, residual, weight, eps, weight_offset)
    out, total = empty_elementwise(x, residual), empty_elementwise(x, residual)
    _triton().launch(x, residual, weight, eps, weight_offset, out, total)
    return out, total


# ----- fxpass::fused_add_rmsnorm_quant ---------------------------------------------------
@torch.library.custom_op(
    "fxpass::fused_add_rmsnorm_quant",
    mutates_args=(),
    schema="(Tensor x, Tensor residual, Tensor weight, Tensor scale, float eps,"
    " float weight_offset=0.0) -> (Tensor, Tensor)",
)
def fused_add_rmsnorm_quant(
    x: Tensor,
    residual: Tensor,
    weight: Tensor,
    scale: Tensor,
    eps: float,
    weight_offset: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """``(int8(clamp(round(rms_norm(x + residual) / scale))), x + residual)`` (SGLang W8A8),
    both laid out like ``x + residual``."""
    _check_norm("fused_add_rmsnorm_quant", x, weight)
    _check_residual("fused_add_rmsnorm_quant", x, residual)
    _check_scale("fused_add_rmsnorm_quant", scale)
    normed, total = _fused_add_cpu(x, residual, weight, eps, weight_offset)
    return reference.quantize_int8(normed, scale), total


@fused_add_rmsnorm_quant.register_fake
def _(x, residual, weight, scale, eps, weight_offset=0.0):
    _check_norm("fused_add_rmsnorm_quant", x, weight)
    _check_residual("fused_add_rmsnorm_quant", x, residual)
    _check_scale("fused_add_rmsnorm_quant", scale)
    return empty_elementwise(x, residual, dtype=torch.int8), empty_elementwise(x, residual)


@fused_add_rmsnorm_quant.register_kernel("cuda")
def _(x, residual, weight, scale, eps, weight_offset=0.0):
    _check_norm("fused_add_rmsnorm_quant", x, weight)
    _check_residual("fused_add_rmsnorm_quant", x, residual)
    _check_scale("fused_add_rmsnorm_quant", scale)
    if kernel_for(x) != "triton":
        return reference.fused_add_rmsnorm_quant(x, residual, weight, scale, eps, weight_offset)
    out = empty_elementwise(x, residual, dtype=torch.int8)
    total = empty_elementwise(x, residual)
    scale = scale.reshape(1).to(torch.float32)
    _triton().launch(x, residual, weight, eps, weight_offset, out, total, scale)
    return out, total


# ----- fxpass::fused_add_rmsnorm_ (in place, flashinfer-style) ---------------------------
def _check_in_place(x: Tensor, residual: Tensor, weight: Tensor) -> None:
    _check_norm("fused_add_rmsnorm_", x, weight)
    _check_residual("fused_add_rmsnorm_", x, residual)
    _check_writable("fused_add_rmsnorm_", "x", x)
    _check_writable("fused_add_rmsnorm_", "residual", residual)


@torch.library.custom_op(
    "fxpass::fused_add_rmsnorm_",
    mutates_args=("x", "residual"),
    schema="(Tensor(a!) x, Tensor(b!) residual, Tensor weight, float eps,"
    " float weight_offset=0.0) -> ()",
)
def fused_add_rmsnorm_(
    x: Tensor, residual: Tensor, weight: Tensor, eps: float, weight_offset: float = 0.0
) -> None:
    """In place: ``residual`` becomes ``x + residual`` and ``x`` its RMSNorm (each keeps its
    own layout)."""
    _check_in_place(x, residual, weight)
    normed, total = _fused_add_cpu(x, residual, weight, eps, weight_offset)
    residual.copy_(total)
    x.copy_(normed)


@fused_add_rmsnorm_.register_fake
def _(x, residual, weight, eps, weight_offset=0.0):
    _check_in_place(x, residual, weight)


@fused_add_rmsnorm_.register_kernel("cuda")
def _(x, residual, weight, eps, weight_offset=0.0):
    _check_in_place(x, residual, weight)
    in_place = (
        kernel_for(x) == "triton"
        and x.is_contiguous()
        and residual.is_contiguous()
        and residual.dtype == x.dtype
    )
    if not in_place:  # strided or mixed-dtype operands: compute, then copy back
        normed, total = fused_add_rmsnorm(x, residual, weight, eps, weight_offset)
        residual.copy_(total)
        x.copy_(normed)
        return
    _triton().launch(x, residual, weight, eps, weight_offset, x, residual)


# ----- autograd ---------------------------------------------------------------------------
def _rms_norm_grads(
    grad: Tensor, x: Tensor, weight: Tensor, eps: float, weight_offset: float
) -> tuple[Tensor, Tensor]:
    """Gradients of rms_norm w.r.t. its input (input-shaped) and weight (1-D), in float32
    (float64 for float64 inputs)."""
    acc = reference._acc_dtype(x)
    h = x.to(acc)
    rstd = torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    g = grad.to(acc)
    gw = g * (weight.to(acc) + weight_offset)
    dx = rstd * gw - h * rstd.pow(3) * (gw * h).mean(-1, keepdim=True)
    dw = (g * h * rstd).reshape(-1, x.shape[-1]).sum(0)
    return dx, dw


def _setup_rms_norm(ctx, inputs, output) -> None:
    x, weight, eps, weight_offset = inputs
    ctx.save_for_backward(x, weight)
    ctx.eps, ctx.weight_offset = eps, weight_offset


def _grad(g: Tensor, like: Tensor | tuple, dtype: torch.dtype) -> Tensor:
    """``g`` in ``dtype``, laid out as an input's gradient is: like the input, made dense."""
    strides = elementwise_strides(like) if isinstance(like, Tensor) else like
    return in_layout(g.to(dtype), strides)


def _backward_rms_norm(ctx, grad):
    x, weight = ctx.saved_tensors
    dx, dw = _rms_norm_grads(grad, x, weight, ctx.eps, ctx.weight_offset)
    return _grad(dx, x, x.dtype), _grad(dw, weight, weight.dtype), None, None


def _save_input_layouts(ctx, x: Tensor, residual: Tensor) -> None:
    ctx.dtypes = (x.dtype, residual.dtype)
    ctx.layouts = (elementwise_strides(x), elementwise_strides(residual))


def _setup_fused_add(ctx, inputs, output) -> None:
    x, residual, weight, eps, weight_offset = inputs
    ctx.save_for_backward(output[1], weight)
    ctx.eps, ctx.weight_offset = eps, weight_offset
    _save_input_layouts(ctx, x, residual)


def _backward_fused_add(ctx, grad_normed, grad_total):
    total, weight = ctx.saved_tensors
    d_sum, dw = _rms_norm_grads(grad_normed, total, weight, ctx.eps, ctx.weight_offset)
    d_sum = d_sum + grad_total.to(d_sum.dtype)
    (x_dtype, r_dtype), (x_layout, r_layout) = ctx.dtypes, ctx.layouts
    dx, dr = _grad(d_sum, x_layout, x_dtype), _grad(d_sum, r_layout, r_dtype)
    return dx, dr, _grad(dw, weight, weight.dtype), None, None


def _setup_quant(ctx, inputs, output) -> None:
    _save_input_layouts(ctx, inputs[0], inputs[1])
    ctx.mark_non_differentiable(output[0])


def _backward_quant(ctx, grad_quantized, grad_total):
    # rounding has a zero derivative: only the residual sum carries a gradient
    (x_dtype, r_dtype), (x_layout, r_layout) = ctx.dtypes, ctx.layouts
    dx, dr = _grad(grad_total, x_layout, x_dtype), _grad(grad_total, r_layout, r_dtype)
    return dx, dr, None, None, None, None


rms_norm.register_autograd(_backward_rms_norm, setup_context=_setup_rms_norm)
fused_add_rmsnorm.register_autograd(_backward_fused_add, setup_context=_setup_fused_add)
fused_add_rmsnorm_quant.register_autograd(_backward_quant, setup_context=_setup_quant)


# ----- decompositions: each op in torch's own ops (fxpass run --portable) -----------------
def _rms_norm_aten(x: Tensor, weight: Tensor, eps: float, weight_offset: float) -> Tensor:
    acc = reference._acc_dtype(x)
    h = x.to(acc)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    w = weight.to(acc) + weight_offset if weight_offset else weight.to(acc)
    return (h * w).to(x.dtype)


@decomposes(rms_norm)
def _rms_norm_decomposed(x, weight, eps, weight_offset=0.0):
    return _rms_norm_aten(x, weight, eps, weight_offset)


@decomposes(fused_add_rmsnorm)
def _fused_add_rmsnorm_decomposed(x, residual, weight, eps, weight_offset=0.0):
    total = (x + residual).to(x.dtype)
    return _rms_norm_aten(total, weight, eps, weight_offset), total


@decomposes(fused_add_rmsnorm_quant)
def _fused_add_rmsnorm_quant_decomposed(x, residual, weight, scale, eps, weight_offset=0.0):
    normed, total = _fused_add_rmsnorm_decomposed(x, residual, weight, eps, weight_offset)
    q = torch.clamp(torch.round(normed.float() / scale.reshape(())), -128, 127)
    return q.to(torch.int8), total


@decomposes(fused_add_rmsnorm_)
def _fused_add_rmsnorm__decomposed(x, residual, weight, eps, weight_offset=0.0):
    normed, total = _fused_add_rmsnorm_decomposed(x, residual, weight, eps, weight_offset)
    residual.copy_(total)
    x.copy_(normed)
