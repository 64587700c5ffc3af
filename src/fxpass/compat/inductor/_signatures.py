"""What a trace depends on, as keys: a match's values by their dtypes, devices, ranks and
0/1 sizes (:func:`signature`: one trace with symbolic sizes serves them all), or by their
exact sizes (:func:`static_signature`: numbers, or a graph's own symbolic sizes)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["signature", "static_signature"]


def _concrete(seq: Sequence[Any]) -> bool:
    return all(isinstance(s, int) for s in seq)


def _contiguous(shape: Sequence[int], stride: Sequence[Any]) -> bool:
    expected = 1
    for size, step in zip(reversed(shape), reversed(stride)):
        if size != 1 and step != expected:
            return False
        expected *= size
    return True


def signature(values: Sequence[Any], grads: Sequence[bool] | None = None) -> tuple:
    """What a trace with symbolic sizes depends on: per tensor its dtype, device, rank,
    which sizes are 0 or 1, whether it is contiguous and requires grad (``grads[i]`` when
    given: the example's, as the trace sees it) and which earlier input it is, if any (one
    value passed twice is traced as one: ``x * y`` becomes ``y * y``); other values
    themselves."""
    out: list[Any] = []
    first: dict[int, int] = {}
    for i, v in enumerate(values):
        if isinstance(v, torch.Tensor):
            shape = tuple(v.shape)
            small = tuple(s if isinstance(s, int) and s < 2 else -1 for s in shape)
            contiguous = _contiguous(shape, v.stride()) if _concrete(shape) else None
            grad = grads[i] if grads is not None else v.requires_grad
            same = first.setdefault(id(v), i)
            out.append(("T", v.dtype, str(v.device), v.dim(), small, contiguous, grad, same))
        else:
            try:
                hash(v)
                out.append(("V", type(v).__name__, v))
            except TypeError:
                out.append(("id", id(v)))
    return tuple(out)


def static_signature(values: Sequence[Any], *, exact: bool = False) -> tuple | None:
    """The values' exact sizes and strides (with dtypes, devices...): None if one is
    symbolic, or with ``exact``, those of a symbolic one as the expressions of its graph's
    shape environment (the same sizes, where a trace with the values themselves holds)."""
    out: list[Any] = []
    first: dict[int, int] = {}
    for i, v in enumerate(values):
        if isinstance(v, torch.Tensor):
            if _concrete(v.shape) and _concrete(v.stride()):
                shape, stride = tuple(v.shape), tuple(v.stride())
            elif not exact:
                return None
            else:
                env = _shape_env(v)
                if env is None:
                    return None
                shape = (id(env), *map(_expr, v.shape))
                stride = tuple(map(_expr, v.stride()))
            same = first.setdefault(id(v), i)  # as in signature
            out.append((v.dtype, str(v.device), shape, stride, same))
        else:
            out.append(signature([v]))
    return tuple(out)


def _expr(s: Any) -> Any:
    return s.node.expr if isinstance(s, torch.SymInt) else s


def _shape_env(v: torch.Tensor) -> Any:
    for s in (*v.shape, *v.stride()):
        if isinstance(s, torch.SymInt):
            return s.node.shape_env
    return None
