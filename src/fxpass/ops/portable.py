"""Each fused op in torch's own ops: what ``fxpass run --portable`` writes in its place.

A program that calls ``torch.ops.fxpass.*`` loads where fxpass is installed (its torch
plug-in registers the ops). For consumers without fxpass, the ``lower_fused_ops`` pass
replaces every call with the op's *decomposition*: a plain PyTorch function, kept next to
the op it lowers (``ops/norm.py``, ``ops/collective.py``), traced into ATen ops where the
call was. A decomposition computes what the op's reference kernel computes
(:mod:`fxpass.ops.reference`; ``tests/ops/test_portable.py`` checks every op, dtype and
layout), and its results have the layout the unfused ATen ops give.

>>> from fxpass.ops.portable import decomposition
>>> decomposition(torch.ops.fxpass.rms_norm.default)(torch.ones(2, 4), torch.ones(4), 1e-6).shape
torch.Size([2, 4])
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["DECOMPOSITIONS", "decomposes", "decomposition"]

#: op overload -> its decomposition (same arguments, same results, torch's own ops only)
DECOMPOSITIONS: dict[Any, Callable[..., Any]] = {}


def decomposes(op: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register the decorated function as the decomposition of ``op`` (a custom op made with
    ``torch.library.custom_op``, or one of its overloads)."""
    overload = getattr(op, "_opoverload", op)

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        DECOMPOSITIONS[overload] = fn
        return fn

    return register


def decomposition(target: Any) -> Callable[..., Any] | None:
    """The decomposition of the op ``target`` (an OpOverload), or None."""
    return DECOMPOSITIONS.get(target)
