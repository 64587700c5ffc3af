"""Op dialects: ExecuTorch's Edge ops are ATen ops under another name.

``executorch.exir.to_edge`` replaces each ``torch.ops.aten`` target with an
``EdgeOpOverload`` (``exir_ops.edge.aten.add.Tensor``) that wraps the same ATen op and
schema. Code that asks "which op is this node?" asks :func:`aten_op`, so a pattern, a
support spec or a pass written against ATen sees Edge graphs too; code that emits ops into
an Edge graph asks :func:`edge_op` for the Edge spelling. Nothing here imports
``executorch``: an Edge op is recognised by its type's name and wrapped op.

>>> aten_op(torch.ops.aten.add.Tensor) is torch.ops.aten.add.Tensor
True
"""

from __future__ import annotations

import functools
from typing import Any

import torch

__all__ = ["aten_op", "edge_op", "is_edge_op"]

_EDGE_TYPES = frozenset({"EdgeOpOverload", "EdgeOpOverloadPacket"})


def is_edge_op(target: Any) -> bool:
    """Whether ``target`` is an ExecuTorch Edge op (an overload or a packet)."""
    return type(target).__name__ in _EDGE_TYPES


def aten_op(target: Any) -> Any:
    """The ATen op behind ``target``: the wrapped ``OpOverload`` of an Edge overload, the
    ``OpOverloadPacket`` of an Edge packet, else ``target`` itself."""
    kind = type(target).__name__
    if kind == "EdgeOpOverload":
        return target._op
    if kind == "EdgeOpOverloadPacket":
        namespace, name = target._qualified_op_name.split("::", 1)
        return getattr(getattr(torch.ops, namespace), name)
    return target


def edge_op(op: torch._ops.OpOverload) -> Any:
    """The Edge spelling of the ATen (or custom) op ``op``.

    Raises ``ModuleNotFoundError`` with the install hint where ``executorch`` is missing, and
    ``AttributeError`` naming the op where the Edge dialect has no such op.
    """
    return _edge_op(aten_op(op))


@functools.cache
def _edge_op(op: torch._ops.OpOverload) -> Any:
    try:
        from executorch.exir.dialects._ops import ops as exir_ops
    except ModuleNotFoundError as e:  # pragma: no cover - executorch is in the test extra
        raise ModuleNotFoundError(
            "emitting Edge-dialect ops needs executorch: pip install 'fxpass[executorch]'"
        ) from e
    namespace, rest = op.name().split("::", 1)
    name, _, overload = rest.partition(".")
    try:
        return getattr(getattr(getattr(exir_ops.edge, namespace), name), overload or "default")
    except (AttributeError, RuntimeError) as e:
        raise AttributeError(f"the Edge dialect has no op for {op} ({e})") from e
