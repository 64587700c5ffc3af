"""Op dialects: ExecuTorch's Edge ops are ATen ops under another name.

``executorch.exir.to_edge`` replaces each ``torch.ops.aten`` target with an
``EdgeOpOverload`` (``exir_ops.edge.aten.add.Tensor``) that wraps the same ATen op and
schema. Code that asks "which op is this node?" asks :func:`aten_op`, so a pattern, a
support spec or a pass written against ATen sees Edge graphs too; code that emits ops into
an Edge graph asks :func:`edge_op` for the Edge spelling. ExecuTorch's dim-order ops
(``dim_order_ops._to_dim_order_copy``, ``_clone_dim_order``, ``_empty_dim_order``) are the
Edge dialect's spellings of ``aten._to_copy``, ``aten.clone`` and ``aten.empty``
(``to_edge`` swaps the memory format for a dim order), so :func:`aten_op` maps them there.
Nothing here imports ``executorch``: an Edge op is recognised by its type's name and
wrapped op.

>>> aten_op(torch.ops.aten.add.Tensor) is torch.ops.aten.add.Tensor
True
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Iterable
from typing import Any

import torch

__all__ = [
    "aten_op",
    "edge_call",
    "edge_op",
    "graph_is_edge",
    "has_dim_order_spelling",
    "is_edge_op",
    "spellings",
    "uses_dim_order",
]

_EDGE_TYPES = frozenset({"EdgeOpOverload", "EdgeOpOverloadPacket"})
_EXIR_OPS = "executorch.exir.dialects._ops"

# ExecuTorch's dim-order ops and the ATen op each replaces (same arguments, except that a
# dim order stands for the memory format)
_DIM_ORDER = {
    "dim_order_ops::_to_dim_order_copy": ("_to_copy", "default"),
    "dim_order_ops::_clone_dim_order": ("clone", "default"),
    "dim_order_ops::_empty_dim_order": ("empty", "memory_format"),
}


def is_edge_op(target: Any) -> bool:
    """Whether ``target`` is an ExecuTorch Edge op (an overload or a packet)."""
    return type(target).__name__ in _EDGE_TYPES


def aten_op(target: Any) -> Any:
    """The ATen op behind ``target``: the wrapped ``OpOverload`` of an Edge overload, the
    ``OpOverloadPacket`` of an Edge packet, the ATen op a dim-order op replaces, else
    ``target`` itself."""
    kind = type(target).__name__
    if kind == "EdgeOpOverload":
        target = target._op
    elif kind == "EdgeOpOverloadPacket":
        namespace, name = target._qualified_op_name.split("::", 1)
        return getattr(getattr(torch.ops, namespace), name)
    elif kind != "OpOverload":
        return target
    if target._name.startswith("dim_order_ops::") and target._overloadname == "default":
        equivalent = _DIM_ORDER.get(target._name)
        if equivalent is not None:
            return getattr(getattr(torch.ops.aten, equivalent[0]), equivalent[1])
    return target


def edge_op(op: torch._ops.OpOverload) -> Any:
    """The Edge spelling of the ATen (or custom) op ``op``.

    Raises ``ModuleNotFoundError`` with the install hint where ``executorch`` is missing, and
    ``AttributeError`` naming the op where the Edge dialect has no such op.
    """
    return op if is_edge_op(op) else _edge_op(op)


def has_dim_order_spelling(op: Any) -> bool:
    """Whether ExecuTorch spells the ATen op ``op`` as a dim-order op (with another schema):
    ``_to_copy``, ``clone`` and ``empty.memory_format``."""
    if not isinstance(op, torch._ops.OpOverload):
        return False
    name = op._schema.name
    return name.startswith("aten::") and (name[6:], op._overloadname) in _DIM_ORDER.values()


def spellings(op: Any) -> tuple[Any, ...]:
    """The other targets that stand for the ATen op ``op`` in the dialects this process has
    loaded: its Edge op and, for ``_to_copy``, ``clone`` and ``empty``, ExecuTorch's dim-order
    op and its Edge op. Empty where ``executorch`` is not imported (a process holding an Edge
    graph has imported it); never imports it. The inverse of :func:`aten_op`."""
    if _EXIR_OPS not in sys.modules or not isinstance(op, torch._ops.OpOverload):
        return ()
    return _spellings(op)


@functools.cache
def _spellings(op: torch._ops.OpOverload) -> tuple[Any, ...]:
    found = [op]
    for name, (aten_name, overload) in _DIM_ORDER.items():
        if op._schema.name == f"aten::{aten_name}" and op._overloadname == overload:
            namespace, short = name.split("::")
            packet = getattr(getattr(torch.ops, namespace), short, None)
            if packet is not None:
                found.append(packet.default)
    out = []
    for target in found:
        if target is not op:
            out.append(target)
        with contextlib.suppress(AttributeError, RuntimeError):
            out.append(_edge_op(target))
    return tuple(out)


def edge_call(op: Any, args: tuple, kwargs: dict, *, dim_order: bool = True):
    """``(target, args, kwargs)`` with which an Edge graph calls the op ``op``: its Edge op;
    for ``_to_copy``, ``clone`` and ``empty`` in a graph that uses dim orders (ExecuTorch's
    default, see :func:`uses_dim_order`) the Edge dim-order op, when no memory format other
    than ``preserve_format`` is asked for. Edge ops come back as they are."""
    if is_edge_op(op):
        return op, args, kwargs
    fmt = kwargs.get("memory_format")
    if dim_order and has_dim_order_spelling(op) and fmt in (None, torch.preserve_format):
        key = (op._schema.name[6:], op._overloadname)
        name = next(k for k, v in _DIM_ORDER.items() if v == key)
        namespace, short = name.split("::")
        target = _edge_op(getattr(getattr(torch.ops, namespace), short).default)
        kwargs = {k: v for k, v in kwargs.items() if k != "memory_format"}
        return target, args, kwargs
    return _edge_op(op), args, kwargs


def uses_dim_order(nodes: Iterable[Any]) -> bool:
    """Whether an Edge graph spells ``_to_copy``, ``clone`` and ``empty`` with ExecuTorch's
    dim-order ops (the default): False when it calls their memory-format Edge ops."""
    return not any(
        n.op == "call_function"
        and type(n.target).__name__ == "EdgeOpOverload"
        and has_dim_order_spelling(n.target._op)
        for n in nodes
    )


def graph_is_edge(nodes: Iterable[Any]) -> bool:
    """Whether any of ``nodes`` (FX nodes) calls an Edge op: new nodes among them should
    call Edge ops too."""
    return any(n.op == "call_function" and is_edge_op(n.target) for n in nodes)


@functools.cache
def _edge_op(op: torch._ops.OpOverload) -> Any:
    try:
        from executorch.exir.dialects._ops import ops as exir_ops
    except ModuleNotFoundError as e:  # pragma: no cover - executorch is in the test extra
        raise ModuleNotFoundError(
            "emitting Edge-dialect ops needs executorch: pip install executorch==1.5.1 (from "
            "fxpass's checkout: pip install -e '.[executorch]')"
        ) from e
    namespace, rest = op.name().split("::", 1)
    name, _, overload = rest.partition(".")
    try:
        return getattr(getattr(getattr(exir_ops.edge, namespace), name), overload or "default")
    except (AttributeError, RuntimeError) as e:
        raise AttributeError(f"the Edge dialect has no op for {op} ({e})") from e
