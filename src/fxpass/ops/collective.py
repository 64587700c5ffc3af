"""A collective fused with the norm that follows it: all-reduce + residual add + RMSNorm.

==========================================  ================================================
op                                          schema
==========================================  ================================================
``fxpass::all_reduce_add_rmsnorm``          ``(Tensor x, Tensor residual, Tensor weight,
                                            float eps, float weight_offset, str group_name)
                                            -> (Tensor normed, Tensor residual_out)``
==========================================  ================================================

``residual_out = all_reduce_sum(x) + residual`` (in ``x``'s dtype) and ``normed`` its
RMSNorm: what a tensor-parallel layer computes after its row-parallel projection (vLLM and
TensorRT-LLM fuse the same three steps). The process group is named by string, as torch's
functional collectives name it (``"0"`` is the default group).

Kernels: the reference — on every device — is the collective
(``torch.ops._c10d_functional.all_reduce`` and its ``wait_tensor``) followed by
:func:`fxpass::fused_add_rmsnorm <fxpass.ops.norm.fused_add_rmsnorm>`. A fused GPU
kernel (one-shot all-reduce that normalizes the rows it reduces) would register with
``all_reduce_add_rmsnorm.register_kernel("cuda")`` and must return what the reference
returns. Both outputs are contiguous whatever the layout of the inputs, in the real and the
fake kernel alike.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .norm import _check_norm, _check_residual, _fused_add_rmsnorm_decomposed
from .portable import decomposes

__all__ = ["all_reduce_add_rmsnorm"]

_NAME = "all_reduce_add_rmsnorm"


def _check_group(group_name: str) -> None:
    torch._check(
        isinstance(group_name, str) and bool(group_name),
        lambda: f"fxpass.{_NAME}: group_name must name a process group, got {group_name!r}",
    )


@torch.library.custom_op(
    f"fxpass::{_NAME}",
    mutates_args=(),
    schema="(Tensor x, Tensor residual, Tensor weight, float eps, float weight_offset,"
    " str group_name) -> (Tensor, Tensor)",
)
def all_reduce_add_rmsnorm(
    x: Tensor,
    residual: Tensor,
    weight: Tensor,
    eps: float,
    weight_offset: float,
    group_name: str,
) -> tuple[Tensor, Tensor]:
    """``(rms_norm(all_reduce(x) + residual), all_reduce(x) + residual)`` over the process
    group ``group_name``."""
    _check_norm(_NAME, x, weight)
    _check_residual(_NAME, x, residual)
    _check_group(group_name)
    c10d = torch.ops._c10d_functional
    reduced = c10d.wait_tensor(c10d.all_reduce(x, "sum", group_name))
    normed, total = torch.ops.fxpass.fused_add_rmsnorm(
        reduced, residual, weight, eps, weight_offset
    )
    return normed.contiguous(), total.contiguous()


@all_reduce_add_rmsnorm.register_fake
def _(x, residual, weight, eps, weight_offset, group_name):
    _check_norm(_NAME, x, weight)
    _check_residual(_NAME, x, residual)
    _check_group(group_name)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    return out, torch.empty_like(out)


@decomposes(all_reduce_add_rmsnorm)
def _all_reduce_add_rmsnorm_decomposed(x, residual, weight, eps, weight_offset, group_name):
    """The functional all-reduce, its wait, then the residual add and RMSNorm in ATen."""
    c10d = torch.ops._c10d_functional
    reduced = c10d.wait_tensor(c10d.all_reduce(x, "sum", group_name))
    normed, total = _fused_add_rmsnorm_decomposed(reduced, residual, weight, eps, weight_offset)
    return normed.contiguous(), total.contiguous()
