"""Tensor layouts: the strides an elementwise result gets, and when two layouts are the same.

PyTorch's elementwise ops (TensorIterator) give their result a *dense* layout in the
dimension order of their inputs: a dense input (contiguous, transposed, permuted) keeps
its layout, a sliced one gets a dense layout in its own dimension order, a broadcast
(expanded) dimension takes its place in logical order. :func:`elementwise_strides` computes
that layout, so an op that promises "the layout the unfused chain produces" can compute it
the same way in its fake and its real kernels.

Two layouts are the same when their *significant* strides agree: the strides of dimensions
longer than one (a dimension of size one is never stepped over, so its stride means nothing;
torch's fake-tensor checks and Inductor's ``assert_size_stride`` ignore it too).

>>> x = torch.empty(2, 8, 4, 16).transpose(1, 2)
>>> elementwise_strides(x) == x.stride()
True
>>> elementwise_strides(x[..., :8])        # sliced: dense, in x's dimension order
(256, 8, 32, 1)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch._prims_common import (
    compute_elementwise_output_logical_to_physical_perm,
    is_non_overlapping_and_dense_or_false,
    make_contiguous_strides_for,
)
from torch.fx.experimental.symbolic_shapes import statically_known_true

__all__ = [
    "elementwise_strides",
    "empty_elementwise",
    "format_layout",
    "in_layout",
    "memory_order",
    "same_layout",
    "significant_strides",
]


def elementwise_strides(*tensors: torch.Tensor) -> tuple[Any, ...]:
    """The strides of an elementwise op's result on same-shape ``tensors`` (TensorIterator's
    rule: dense, in the inputs' dimension order, the first input deciding ties)."""
    shape = tensors[0].shape
    if len(shape) <= 1:
        return tuple(make_contiguous_strides_for(shape))
    perm, _ = compute_elementwise_output_logical_to_physical_perm(*tensors)
    physical = make_contiguous_strides_for([shape[p] for p in perm])
    strides: list[Any] = [0] * len(shape)
    for i, p in enumerate(perm):
        strides[p] = physical[i]
    return tuple(strides)


def empty_elementwise(*tensors: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """An uninitialized tensor shaped like ``tensors[0]``, laid out by
    :func:`elementwise_strides`, on the first tensor's device."""
    first = tensors[0]
    return torch.empty_strided(
        first.shape, elementwise_strides(*tensors), dtype=dtype or first.dtype, device=first.device
    )


def significant_strides(shape: Sequence[Any], strides: Sequence[Any]) -> tuple[Any, ...]:
    """``strides`` without those of size-one dimensions (which address nothing)."""
    return tuple(st for n, st in zip(shape, strides) if n != 1)


def same_layout(a: torch.Tensor, b: torch.Tensor | Sequence[Any]) -> bool:
    """Whether ``a`` has the layout of ``b`` (a tensor of ``a``'s shape, or strides). With
    symbolic shapes, only strides known to be equal count as equal (no guards are added)."""
    strides = b.stride() if isinstance(b, torch.Tensor) else tuple(b)
    mine = significant_strides(a.shape, a.stride())
    theirs = significant_strides(a.shape, strides)
    return len(mine) == len(theirs) and all(_known_equal(x, y) for x, y in zip(mine, theirs))


def _known_equal(a: Any, b: Any) -> bool:
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    return statically_known_true(a == b)


def memory_order(t: torch.Tensor) -> list[int] | None:
    """``t``'s dimensions from outermost to innermost in memory, when ``t`` is dense with
    plain (not symbolic) strides: ``t.permute(order)`` is then contiguous. Else None."""
    strides = t.stride()
    if not all(isinstance(s, int) for s in strides) or not is_non_overlapping_and_dense_or_false(t):
        return None
    return sorted(range(t.dim()), key=lambda d: (-strides[d], -t.shape[d]))


def in_layout(t: torch.Tensor, strides: Sequence[Any]) -> torch.Tensor:
    """``t`` itself when it already has the layout ``strides``, else a copy laid out so."""
    if same_layout(t, strides):
        return t
    return torch.empty_strided(t.shape, tuple(strides), dtype=t.dtype, device=t.device).copy_(t)


def format_layout(t: Any) -> str:
    """``shape (2, 4) strides (4, 1)`` for a tensor, or ``repr`` of anything else."""
    if isinstance(t, torch.Tensor):
        return f"shape {tuple(t.shape)} strides {tuple(t.stride())}"
    return repr(t)
