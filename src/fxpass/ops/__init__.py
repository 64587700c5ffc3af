"""fxpass's fused custom ops, registered under ``torch.ops.fxpass`` when this is imported.

>>> import torch, fxpass
>>> x, w = torch.randn(2, 8), torch.ones(8)
>>> torch.ops.fxpass.rms_norm(x, w, 1e-6).shape
torch.Size([2, 8])

See :mod:`fxpass.ops.norm` for the ops and their schemas, and :mod:`fxpass.ops.reference`
for the formulas every kernel follows.
"""

from __future__ import annotations

from . import reference
from .collective import all_reduce_add_rmsnorm
from .norm import (
    fused_add_rmsnorm,
    fused_add_rmsnorm_,
    fused_add_rmsnorm_quant,
    kernel_for,
    rms_norm,
)

__all__ = [
    "all_reduce_add_rmsnorm",
    "fused_add_rmsnorm",
    "fused_add_rmsnorm_",
    "fused_add_rmsnorm_quant",
    "kernel_for",
    "reference",
    "rms_norm",
]
