"""``remove_noop``: drop views, conversions, copies and dropouts that change nothing."""

from __future__ import annotations

import torch
from torch import fx

from ...core.analyses import aliasing, positions
from ...core.context import PassContext
from ...core.pass_registry import register
from ...edit.alias import AliasInfo
from ...fxutil.dialect import aten_op
from ...fxutil.values import fake_value, node_val
from ...fxutil.views import view_variant
from ._copies import copy_is_unobservable, input_becomes_output, same_layout, view_is_replaceable

__all__ = ["remove_noop"]

aten, prims = torch.ops.aten, torch.ops.prims

# ATen ops whose result shares memory with their first argument: a no-op when the layout
# does not change (same shape, dtype, strides)
_ATEN_VIEWS = {
    aten.view,
    aten.reshape,
    aten._unsafe_view,
    aten._reshape_alias,
    aten.expand,
    aten.alias,
    aten.permute,
    aten.slice,
    aten.squeeze,
    aten.unsqueeze,
    aten.transpose,
    aten.flatten,
    aten.contiguous,
    aten.to,
    aten.type_as,
}
# ATen ops that return a fresh copy of their first argument
_ATEN_COPIES = {aten.clone, aten._to_copy, prims.convert_element_type}
# Python-level calls (Dynamo, symbolic_trace) that return their input or a view of it
_PY_VIEWS = {
    "view", "reshape", "expand", "expand_as", "view_as", "reshape_as", "contiguous", "to",
    "float", "half", "bfloat16", "double", "type", "type_as", "permute", "squeeze", "flatten",
}  # fmt: skip
_PY_COPIES = {"clone"}
_DROPOUTS = (torch.nn.Dropout, torch.nn.Dropout1d, torch.nn.Dropout2d, torch.nn.Dropout3d)


def _packet(node: fx.Node):
    return getattr(aten_op(node.target), "overloadpacket", None)


def _py_name(node: fx.Node) -> str:
    if node.op == "call_method":
        return str(node.target)
    if node.op == "call_function" and getattr(node.target, "__module__", "") in ("torch", None):
        return getattr(node.target, "__name__", "")
    return ""


def _dropout_off(node: fx.Node) -> bool:
    """Eval-mode dropout (or p == 0), which returns its input itself."""
    if node.op == "call_module":
        mod = node.graph.owning_module.get_submodule(node.target)
        return isinstance(mod, _DROPOUTS) and (not mod.training or mod.p == 0)
    if node.op != "call_function":
        return False
    dropouts = (aten.dropout.default, torch.dropout, torch._C._VariableFunctions.dropout)
    if node.target in dropouts or aten_op(node.target) is aten.dropout.default:
        train = node.kwargs.get("train", node.args[2] if len(node.args) > 2 else True)
        return train is False
    if node.target is torch.nn.functional.dropout:
        training = node.kwargs.get("training", node.args[2] if len(node.args) > 2 else True)
        return training is False and not node.kwargs.get("inplace", False)
    return False


def _kind(node: fx.Node) -> str | None:
    """ "dropout" (returns its input itself), "view" (shares memory with its input), "copy"
    (a fresh copy), "view_copy" (a fresh copy of a view) or None."""
    if _dropout_off(node):
        return "dropout"
    packet = _packet(node)
    if packet in _ATEN_VIEWS:
        return "view" if not node.kwargs.get("copy", False) else "copy"
    if packet in _ATEN_COPIES:
        return "copy"
    view = view_variant(node.target) if packet is not None else None
    if view is not None and view.overloadpacket in _ATEN_VIEWS:
        return "view_copy"  # view_copy, permute_copy...: functional (Edge) graphs' views
    name = _py_name(node)
    if name in _PY_VIEWS and not node.kwargs.get("copy", False):
        return "view"
    if name in _PY_COPIES:
        return "copy"
    return None


def _view_is_noop(node: fx.Node, src: fx.Node) -> bool:
    """Would the view a ``*_copy`` op copies (``permute`` for ``permute_copy``) return its
    input's exact layout? A contiguous copy of a transpose has its input's shape and
    strides too, and other values: only the view tells."""
    view = fake_value(view_variant(node.target), node.args, node.kwargs)
    return same_layout(view, node_val(src))


@register(
    "remove_noop",
    origin="fxpass",
    statistics={
        "views_removed": "views, reshapes, conversions and dropouts that returned their input",
        "copies_removed": "copies nobody could tell from their source",
    },
    keeps="all",
    preserves=(positions, aliasing),
    edits="editor",
)
def remove_noop(gm: fx.GraphModule, ctx: PassContext, *, copies: bool = True) -> bool:
    """Remove views, reshapes, expands, conversions, copies and dropouts that change nothing.

    A node is dropped when its result has exactly its input's shape, dtype, device and
    strides (from the nodes' example values) and:

    * it shares memory with its input (``view``, ``reshape``, ``expand``, ``permute`` to the
      same order, ``to`` the same dtype, ``contiguous``, eval-mode ``dropout``), or
    * it is a fresh copy (``clone``, ``_to_copy`` to the same dtype and device — eval-mode
      dropout in export and AOT graphs) and nothing can observe that it was one: it is never
      mutated, its source is not mutated while it is read, and it does not hand the
      caller's memory back as an output. ``copies=False`` keeps every copy.

    In functional graphs (ExecuTorch's Edge dialect) a ``*_copy`` of a view
    (``view_copy``, ``permute_copy``...) or a dim-order cast or clone goes when the view it
    copies would be a no-op and nothing can tell the copy from its source.

    Inputs never become direct outputs (backends reject that). Train-mode dropout and
    conversions that change dtype, device or memory layout stay.

    Before / after::

        %clone = aten.clone(%x)                   # eval-mode dropout
        %view = aten.view(%clone, [1, 8, 64])     # same shape        ->  %mm = aten.mm(%x, %w)
        %mm = aten.mm(%view, %w)
    """
    changed, editor = False, ctx.editor
    info: AliasInfo | None = None
    for node in list(gm.graph.nodes):
        kind = _kind(node)
        if kind is None or not node.args or not isinstance(node.args[0], fx.Node):
            continue
        src = node.args[0]
        if kind in ("copy", "view_copy"):
            if not copies or (kind == "view_copy" and not _view_is_noop(node, src)):
                continue
            info = info or aliasing(gm)
            ok = copy_is_unobservable(node, src, info) and view_is_replaceable(node, src)
        elif kind == "dropout":  # returns its input itself, whatever the metadata says
            ok = not input_becomes_output(node, src)
        else:
            ok = view_is_replaceable(node, src)
        if ok and editor.allow():
            editor.replace_all_uses(node, src, "remove_noop")
            ctx.stat("views_removed" if kind in ("view", "dropout") else "copies_removed")
            if kind in (
                "copy",
                "view_copy",
            ):  # readers of the copy now alias its source: rebuild the facts
                info = None
            changed = True
    return changed
