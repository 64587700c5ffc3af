"""Op spellings: which ops a pattern names, how they read, which commute or cast.

An op in a pattern stands for all its spellings (ATen, Edge, dim-order copies; see
:mod:`fxpass.fxutil.dialect`); this module holds the sets the pattern language consults
and the names errors and explanations print.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch.fx import Node

__all__ = ["CAST_OPS", "SYMMETRIC", "Module", "node_key", "op_name"]

aten = torch.ops.aten
prims = torch.ops.prims

OpOverload = torch._ops.OpOverload
OpOverloadPacket = torch._ops.OpOverloadPacket

#: Ops whose first two operands may be swapped without changing the result.
SYMMETRIC: frozenset[Any] = frozenset(
    [
        aten.add.Tensor,
        aten.add.Scalar,
        aten.mul.Tensor,
        aten.mul.Scalar,
        aten.maximum.default,
        aten.minimum.default,
        aten.logical_and.default,
        aten.logical_or.default,
        aten.eq.Tensor,
        aten.ne.Tensor,
        operator.add,
        operator.mul,
        torch.add,
        torch.mul,
        torch.maximum,
        torch.minimum,
        "add",
        "mul",
    ]
)

#: Ops (and methods) that convert a tensor's dtype; their first argument is the input.
CAST_OPS: frozenset[Any] = frozenset(
    [
        aten._to_copy.default,
        aten.to.dtype,
        aten.to.dtype_layout,
        aten.type_as.default,
        prims.convert_element_type.default,
        "to",
        "float",
        "half",
        "bfloat16",
        "double",
        "type",
        "type_as",
    ]
)


class Module:
    """Marks a ``call_module`` target in an op set (see :meth:`P.module`)."""

    __slots__ = ("target",)

    def __init__(self, target: str) -> None:
        self.target = target


def op_name(target: Any) -> str:
    """A readable name for an op target (``aten.mul.Tensor``, ``operator.add``, ``.float()``)."""
    if isinstance(target, str):
        return f".{target}()"
    if isinstance(target, (OpOverload, OpOverloadPacket)):
        return str(target)
    module = getattr(target, "__module__", None) or ""
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", repr(target))
    module = {
        "_operator": "operator",
        "torch._C._VariableFunctions": "torch",
        "torch._VariableFunctionsClass": "torch",
        "torch._C._nn": "torch._C._nn",
    }.get(module, module)
    if module == "torch" or name.startswith("_VariableFunctionsClass."):
        return f"torch.{getattr(target, '__name__', name)}"
    return f"{module}.{name}" if module else name


def node_key(node: Node) -> Any:
    """The key an op-indexed matcher files ``node`` under (see :meth:`Pattern.index_keys`)."""
    op = node.op
    if op == "call_function":
        return node.target
    if op == "call_method":
        return ("method", node.target)
    if op == "call_module":
        return ("module", node.target)
    return (op,)
