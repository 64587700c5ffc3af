"""torch's ``ReplaceViewOpsWithViewCopyOpsPass`` on fxpass's :class:`ExportPass`, for
:func:`~fxpass.compat.executorch.install`.

``to_edge`` runs one pass that is not ExecuTorch's: torch's
``ReplaceViewOpsWithViewCopyOpsPass`` (``torch._export.passes``), which turns each view op
into its ``*_copy`` op (``aten.view`` -> ``aten.view_copy``, ``aten._unsafe_view`` ->
``aten.view_copy``) for backends that plan memory ahead of time. It is written on torch's
own copy of the pass base (``_ExportPassBaseDeprecatedDoNotUse``), which re-runs every node
of the program on fake tensors; for a 16-layer decoder that is a second or more of
``to_edge``.

:class:`ReplaceViewOpsWithViewCopyOpsPass` is the same pass on fxpass's base: the same hook
(torch's code, through torch's own helpers), so the same graph; only the view ops it
replaces run on fake tensors. Where torch's base differs from ExecuTorch's, it does as
torch's does: the module is always a new one, without the old module's ``meta``; inputs get
a fresh ``tensor_meta``; inputs with symbolic sizes are not checked for keeping them. A
program with symbolic sizes or data-dependent values (whose new nodes torch gives
``unbacked_bindings``) runs torch's pass itself.

    graph():                                        graph():
      %v = aten.view(%x, [4, 8])            ->        %v = aten.view_copy(%x, [4, 8])
      %u = aten._unsafe_view(%y, [32])                %u = aten.view_copy(%y, [32])
"""

from __future__ import annotations

from typing import Any

from torch import fx
from torch._export.passes import replace_view_ops_with_view_copy_ops_pass as _torch
from torch._ops import HigherOrderOperator

from ...fxutil.ops import schema_of
from ._pass_base import ExportPass, NodeMetadata, PassResult, ProxyValue
from ._values import is_symbolic

__all__ = ["ReplaceViewOpsWithViewCopyOpsPass"]

_FUNCTIONAL = _torch._NON_FUNCTIONAL_OPS_TO_FUNCTIONAL_OPS


def _needs_torch(gm: fx.GraphModule) -> bool:
    """Symbolic inputs or unbacked values: torch's base records more than fxpass's."""
    for node in gm.graph.nodes:
        if "unbacked_bindings" in node.meta:
            return True
        if node.op == "placeholder" and is_symbolic(node.meta.get("val")):
            return True
    return False


class ReplaceViewOpsWithViewCopyOpsPass(ExportPass):
    """torch's ``ReplaceViewOpsWithViewCopyOpsPass``: every view op becomes its copy."""

    def call_operator(self, op, args, kwargs, meta: NodeMetadata) -> ProxyValue:  # type: ignore[override]
        if op in _FUNCTIONAL:
            return super().call_operator(_FUNCTIONAL[op], args, kwargs, meta)
        if isinstance(op, HigherOrderOperator):
            return super().call_operator(op, args, kwargs, meta)
        if view_copy := _torch.get_view_copy_of_view_op(schema_of(op)):
            return super().call_operator(view_copy, args, kwargs, meta)
        return super().call_operator(op, args, kwargs, meta)

    # ----- as torch's base does ----------------------------------------------------------
    def call(self, graph_module: fx.GraphModule) -> PassResult:
        if _needs_torch(graph_module):
            return _torch.ReplaceViewOpsWithViewCopyOpsPass()(graph_module)
        return super().call(graph_module)

    def should_preserve_symbolic_input_metadata(self) -> bool:
        return False

    def placeholder(self, name: str, arg: Any, meta: NodeMetadata) -> ProxyValue:
        value = super().placeholder(name, arg, meta)
        self._tracer.set_metadata(value.node, arg)  # a fresh tensor_meta, as torch's base
        return value

    def _run_graph(self, gm: fx.GraphModule, inputs: Any) -> None:
        self._changed = True  # torch's base always builds a new module
        super()._run_graph(gm, inputs)

    def call_submodule(self, graph_module: fx.GraphModule, inputs: tuple[Any, ...]) -> PassResult:
        result = super().call_submodule(graph_module, inputs)
        result.graph_module.meta = {}  # torch's base keeps none of the old module's meta
        return result
