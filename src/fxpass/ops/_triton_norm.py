"""Triton kernels for the fused RMSNorm ops (CUDA only; imported on first use on a GPU).

One program normalizes one row. The row is loaded once, vectorized, accumulated in
float32; rows that fit in registers (``N <= _MAX_SINGLE``) are read exactly once, longer rows
take two passes over memory. The same kernel serves all four ops:

* ``HAS_RESIDUAL``: add the residual first and store the sum (``residual_out``);
* ``QUANT``: quantize the normalized value to int8 with a per-tensor scale.

In-place use (``fused_add_rmsnorm_``) passes the same pointers for input and output: every
element is read before it is written by the same program, and the two-pass path puts a
barrier between its passes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_MAX_SINGLE = 16384  # widest row normalized in one pass from registers
_LOOP_BLOCK = 4096


@triton.jit
def _rint(v):
    # round half to even, exactly (torch.round's rule); v - floor(v) is exact in float32
    r = tl.floor(v)
    d = v - r
    odd = (r - 2.0 * tl.floor(r * 0.5)) != 0.0
    up = (d > 0.5) | ((d == 0.5) & odd)
    return tl.where(up, r + 1.0, r)


@triton.jit
def _finish(
    h, rstd, w_ptr, y_ptr, cols, mask, scale, weight_offset,
    OUT_DTYPE: tl.constexpr, QUANT: tl.constexpr,
):  # fmt: skip
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32) + weight_offset
    normed = (h * rstd * w).to(OUT_DTYPE)
    if QUANT:
        q = _rint(tl.div_rn(normed.to(tl.float32), scale))
        q = tl.minimum(tl.maximum(q, -128.0), 127.0)
        tl.store(y_ptr + cols, q.to(tl.int8), mask=mask)
    else:
        tl.store(y_ptr + cols, normed, mask=mask)


@triton.jit
def _load_row(x_ptr, r_ptr, s_ptr, cols, mask, HAS_RESIDUAL: tl.constexpr, SUM_DTYPE: tl.constexpr):
    v = tl.load(x_ptr + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(r_ptr + cols, mask=mask, other=0.0)
        v = (v.to(tl.float32) + r.to(tl.float32)).to(SUM_DTYPE)
        tl.store(s_ptr + cols, v, mask=mask)
    return v.to(tl.float32)


@triton.jit
def _rmsnorm_kernel(
    X, R, W, Y, S, SCALE,
    stride_x, stride_r, stride_y, stride_s,
    N, eps, weight_offset,
    OUT_DTYPE: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    QUANT: tl.constexpr,
    SINGLE: tl.constexpr,
    BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    x_ptr = X + row * stride_x
    y_ptr = Y + row * stride_y
    r_ptr = R + row * stride_r
    s_ptr = S + row * stride_s
    scale = 1.0
    if QUANT:
        scale = tl.load(SCALE).to(tl.float32)
    if SINGLE:
        cols = tl.arange(0, BLOCK)
        mask = cols < N
        h = _load_row(x_ptr, r_ptr, s_ptr, cols, mask, HAS_RESIDUAL, OUT_DTYPE)
        rstd = tl.math.rsqrt(tl.sum(h * h, axis=0) / N + eps)
        _finish(h, rstd, W, y_ptr, cols, mask, scale, weight_offset, OUT_DTYPE, QUANT)
    else:
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, N, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            mask = cols < N
            h = _load_row(x_ptr, r_ptr, s_ptr, cols, mask, HAS_RESIDUAL, OUT_DTYPE)
            acc += h * h
        rstd = tl.math.rsqrt(tl.sum(acc, axis=0) / N + eps)
        tl.debug_barrier()  # the second pass reads the sums the first pass stored
        src = s_ptr if HAS_RESIDUAL else x_ptr
        for start in range(0, N, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            mask = cols < N
            h = tl.load(src + cols, mask=mask, other=0.0).to(tl.float32)
            _finish(h, rstd, W, y_ptr, cols, mask, scale, weight_offset, OUT_DTYPE, QUANT)


_TL_DTYPES = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}


def _rows(t: torch.Tensor, n: int) -> torch.Tensor:
    """``t`` as (rows, n) with unit stride in the last dimension, a view whenever possible."""
    t2 = t.reshape(-1, n)
    return t2 if n <= 1 or t2.stride(1) == 1 else t2.contiguous()


def _row_order(out: torch.Tensor) -> list[int] | None:
    """The order of ``out``'s dimensions in memory, outermost first, when the normalized
    (last) dimension is innermost and ``out`` is dense: ``out.permute(order)`` is then
    contiguous and its rows are rows of memory. None for any other layout."""
    last = out.dim() - 1
    if last < 0:
        return None
    order = [*sorted(range(last), key=lambda d: -out.stride(d)), last]
    return order if out.permute(order).is_contiguous() else None


def launch(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    weight_offset: float,
    out: torch.Tensor,
    residual_out: torch.Tensor | None = None,
    scale: torch.Tensor | None = None,
) -> None:
    """Run the kernel: ``out`` gets the normalized (or quantized) rows, ``residual_out`` the
    sums. The outputs may have any layout: where they are dense with the last dimension
    innermost (every layout the fused ops allocate for such inputs), every tensor is viewed
    in that dimension order and the kernel writes the outputs directly; otherwise it writes
    contiguous buffers that are then copied into the outputs."""
    order = _row_order(out)
    if residual_out is not None and residual_out.stride() != out.stride():
        order = order if _row_order(residual_out) == order else None
    if order is None:
        tmp = torch.empty(out.shape, dtype=out.dtype, device=out.device)
        tmp_sum = None if residual_out is None else torch.empty_like(tmp, dtype=residual_out.dtype)
        _launch_rows(x, residual, weight, eps, weight_offset, tmp, tmp_sum, scale)
        out.copy_(tmp)
        if residual_out is not None:
            residual_out.copy_(tmp_sum)
        return
    if order != list(range(out.dim())):  # the same rows in memory order; rows are independent
        x, out = x.permute(order), out.permute(order)
        residual = residual.permute(order) if residual is not None else None
        residual_out = residual_out.permute(order) if residual_out is not None else None
    _launch_rows(x, residual, weight, eps, weight_offset, out, residual_out, scale)


def _launch_rows(x, residual, weight, eps, weight_offset, out, residual_out, scale) -> None:
    """The launch proper; ``out``/``residual_out`` are contiguous."""
    n = x.shape[-1]
    x2 = _rows(x, n)
    rows = x2.shape[0]
    if rows == 0 or n == 0:
        return
    y2 = out.view(-1, n)
    has_res = residual is not None
    r2 = _rows(residual, n) if has_res else x2
    s2 = residual_out.view(-1, n) if has_res else y2
    single = triton.next_power_of_2(n) <= _MAX_SINGLE
    block = triton.next_power_of_2(n) if single else _LOOP_BLOCK
    num_warps = min(max(block // 256, 1), 16)
    _rmsnorm_kernel[(rows,)](
        x2, r2, weight.contiguous(), y2, s2, scale if scale is not None else x2,
        x2.stride(0), r2.stride(0), y2.stride(0), s2.stride(0),
        n, float(eps), float(weight_offset),
        OUT_DTYPE=_TL_DTYPES[x.dtype],
        HAS_RESIDUAL=has_res,
        QUANT=scale is not None,
        SINGLE=single,
        BLOCK=block,
        num_warps=num_warps,
    )  # fmt: skip
