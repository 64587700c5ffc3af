"""torch's operator-support dict: ``{target typename: None | (arg dtypes, kwarg dtypes)}``,
as ``torch.fx.passes.operator_support.OperatorSupport`` reads it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import fx, nn

from ..fxutil.dialect import aten_op
from ..fxutil.fx_internals import qualified_name
from .support import CALLABLE_OPS, OperatorSupportBase

__all__ = ["OperatorSupport", "arg_dtype", "node_target_name"]


def node_target_name(submodules: Mapping[str, nn.Module], node: fx.Node) -> str:
    """torch's ``get_node_target``: the typename a support dict is keyed by
    (``torch.ops.aten.add.Tensor``, ``_operator.getitem``, ``torch.nn.modules.linear.Linear``)."""
    if node.op == "call_module":
        module = submodules[node.target]
        klass = getattr(module, "_base_class_origin", type(module))
        if klass.__module__ and "acc_ops" in klass.__module__:
            return f"acc_ops.{klass.__name__}"
        return f"{klass.__module__.replace('torch._ops', 'torch.ops')}.{klass.__name__}"
    if node.op == "call_function":
        target = node.target
        if "acc_ops" in (getattr(target, "__module__", None) or ""):
            return f"acc_ops.{target.__name__}"
        return qualified_name(target)
    return node.target if isinstance(node.target, str) else str(node.target)


def arg_dtype(arg: fx.Node) -> Any:
    """The dtype of an argument node: ``tensor_meta``'s, ``meta['val']``'s, or ``meta['type']``."""
    meta = arg.meta.get("tensor_meta")
    if meta is not None and hasattr(meta, "dtype"):
        return meta.dtype
    val = arg.meta.get("val")
    if isinstance(val, torch.Tensor):
        return val.dtype
    return arg.meta.get("type")


class OperatorSupport(OperatorSupportBase):
    """torch's support dict: ``{target typename: None | (arg dtypes, kwarg dtypes)}``.

    An Edge op is looked up under its own name, then under its ATen op's
    (``torch.ops.aten.add.Tensor``).

    ``None`` accepts any dtype; otherwise ``([dtypes of args[0]], [..of args[1]], ...)`` and
    ``{"kwarg": [dtypes]}`` restrict the inputs (``None`` in the args list skips one). Nodes
    that call nothing (placeholders, get_attr, output) are supported, as in torch. Dtypes come
    from ``tensor_meta`` or, on export graphs, ``meta['val']``.
    """

    def __init__(self, support_dict: Mapping[str, Any] | None = None) -> None:
        self._support_dict = support_dict or {}

    def is_node_supported(self, submodules, node):
        if node.op not in CALLABLE_OPS:
            return True
        target = node_target_name(submodules, node)
        if target not in self._support_dict and node.op == "call_function":
            target = qualified_name(aten_op(node.target))  # an Edge op's ATen name
        if target not in self._support_dict:
            return False
        rule = self._support_dict[target]
        if rule is None:
            return True
        args_dtypes, kwargs_dtypes = rule
        for i, dtypes in enumerate(args_dtypes):
            if len(node.args) <= i:
                break
            if dtypes is None or not isinstance(node.args[i], fx.Node):
                continue
            if arg_dtype(node.args[i]) not in dtypes:
                return False
        for key, dtypes in kwargs_dtypes.items():
            value = node.kwargs.get(key)
            if isinstance(value, fx.Node) and arg_dtype(value) not in dtypes:
                return False
        return True

    def describe(self) -> str:
        return "support_dict(" + ", ".join(self._support_dict) + ")"
