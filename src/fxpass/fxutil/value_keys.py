"""The metadata :class:`~fxpass.fxutil.values.FakeResults` keys values by and rebuilds
results from, for code that remembers what was computed on values of that metadata (the
rewriter's recorded replacements, :mod:`fxpass.rewrite.replay`).

>>> key = tensor_key(node.meta["val"])      # None: not keyed (symbolic, a constant)  # doctest: +SKIP
>>> spec = result_spec(node.meta["val"])    # None: cannot be rebuilt  # doctest: +SKIP
>>> val = build_result(spec, mode, prefer=old_val)  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

from .values import _spec, _tensor_key, _Uncacheable, build_result

__all__ = ["build_result", "result_spec", "tensor_key"]


def tensor_key(t: Any) -> tuple | None:
    """``(fake, sizes, strides, storage offset, dtype, device, requires_grad)`` of a fake or
    plain tensor with static sizes; None for anything :class:`FakeResults` does not key (a
    constant-folded fake tensor, symbolic sizes, a sparse or quantized tensor, no tensor)."""
    try:
        return _tensor_key(t)
    except (_Uncacheable, AttributeError):
        return None


def result_spec(value: Any) -> Any:
    """What :func:`build_result` rebuilds ``value`` from (fake tensors, tuples of them,
    literals); None where it cannot: a real or constant tensor, one that requires grad
    (a rebuilt tensor is an autograd leaf), a storage offset, symbolic sizes."""
    grads: list[bool] = []
    try:
        spec = _spec(value, grads)
    except (_Uncacheable, TypeError, AttributeError):
        return None
    return None if any(grads) else spec
