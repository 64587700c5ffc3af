"""fxpass's fused custom ops, registered under ``torch.ops.fxpass`` when this is imported.

>>> import torch, fxpass
>>> x, w = torch.randn(2, 8), torch.ones(8)
>>> torch.ops.fxpass.rms_norm(x, w, 1e-6).shape
torch.Size([2, 8])

See :mod:`fxpass.ops.norm` for the ops and their schemas, :mod:`fxpass.ops.reference`
for the formulas every kernel follows, and :mod:`fxpass.ops.stream` for the stream and event
ops the ``multi_stream`` pass schedules with, and :mod:`fxpass.ops.collective` for the
all-reduce fused with the residual add and RMSNorm that tensor parallelism emits;
:mod:`fxpass.ops.portable` has each op's decomposition into torch's own ops.
"""

from __future__ import annotations

from . import portable, reference, stream
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
    "portable",
    "reference",
    "rms_norm",
    "stream",
]
