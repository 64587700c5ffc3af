"""``inplace_to_functional``: ``relu_`` becomes ``relu`` where nothing can tell."""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

from ...core.analyses import aliasing
from ...core.context import PassContext
from ...core.pass_registry import register
from ...edit.alias import AliasInfo, written_args
from ...edit.dialect_writer import Spelling
from ...edit.editor import Editor
from ...fxutil.dialect import aten_op
from ...fxutil.ops import schema_of
from ...fxutil.values import fake_value, node_val

__all__ = ["inplace_to_functional"]

_NAME = "inplace_to_functional"


def _functional_overload(op: torch._ops.OpOverload) -> torch._ops.OpOverload | None:
    """``aten.add_.Tensor`` -> ``aten.add.Tensor``: same name without ``_``, same arguments,
    nothing written."""
    schema = schema_of(op)
    packet_name = op.__name__.split(".")[0]  # the name without its namespace and overload
    if not packet_name.endswith("_") or packet_name.endswith("__"):
        return None
    if torch.Tag.inplace_view in op.tags:
        return None  # t_, unsqueeze_: they change metadata, not data
    namespace = getattr(torch.ops, op.namespace)
    packet = getattr(namespace, packet_name[:-1], None)
    overload = getattr(packet, op._overloadname, None) if packet is not None else None
    if overload is None:
        return None
    functional = schema_of(overload)
    if functional.is_mutable or len(functional.arguments) != len(schema.arguments):
        return None
    same = all(
        (a.name, str(a.type)) == (b.name, str(b.type))
        for a, b in zip(schema.arguments, functional.arguments)
    )
    return overload if same else None


def _functional_call(node: fx.Node) -> tuple[str, Any, tuple, dict] | None:
    """``(op, target, args, kwargs)`` of the functional twin of an in-place call."""
    args, kwargs = node.args, dict(node.kwargs)
    base = aten_op(node.target)  # an Edge op is its ATen op under another name
    if node.op == "call_function" and isinstance(base, torch._ops.OpOverload):
        target = _functional_overload(base)
        return ("call_function", target, args, kwargs) if target is not None else None
    if node.op == "call_method":
        name = str(node.target)
        plain = name[:-1]
        if name.endswith("_") and not name.endswith("__") and hasattr(torch.Tensor, plain):
            return ("call_method", plain, args, kwargs)
        return None
    if node.op == "call_function" and kwargs.get("inplace") is True:
        kwargs["inplace"] = False
        return ("call_function", node.target, args, kwargs)
    if node.op == "call_function" and getattr(node.target, "__module__", "") == "torch":
        name = getattr(node.target, "__name__", "")
        plain = getattr(torch, name[:-1], None) if name.endswith("_") else None
        if plain is not None and not name.endswith("__"):
            return ("call_function", plain, args, kwargs)
    return None


def _safe(node: fx.Node, self_node: fx.Node, info: AliasInfo) -> bool:
    """The written tensor is the graph's own, no view of it exists before the write, and the
    functional result has its exact shape and dtype."""
    if info.roots(self_node) != {self_node} or info.external({self_node}):
        return False
    here = info.pos[node]
    earlier_aliases = [
        a for a in info.aliases({self_node}) if a is not self_node and info.pos[a] < here
    ]
    return not earlier_aliases


def _rewrite(
    node: fx.Node, self_node: fx.Node, call: tuple, info: AliasInfo, editor: Editor
) -> bool:
    op, target, args, kwargs = call
    val = fake_value(target, args, kwargs, method=op == "call_method")
    old = node_val(self_node)
    if not isinstance(val, torch.Tensor) or not isinstance(old, torch.Tensor):
        return False
    if (val.shape, val.dtype, val.device) != (old.shape, old.dtype, old.device):
        return False  # type promotion or broadcasting: the functional op differs
    graph = node.graph
    if op == "call_function" and aten_op(node.target) is not node.target:
        target, args, kwargs = Spelling(graph)(target, args, kwargs)
    with editor.change("replace", _NAME, [node]) as change:
        new = editor.insert(target, args, kwargs, op=op, rule=_NAME, origin=[node], before=node)
        new.meta["val" if "val" in self_node.meta else "example_value"] = val
        here = info.pos[node]
        for reader in list(self_node.users):
            if reader not in (node, new) and info.pos.get(reader, here + 1) > here:
                editor.replace_input(reader, self_node, new, rule=_NAME)
        editor.replace_all_uses(node, new, _NAME)
        change.new = [new]
    return True


@register(
    "inplace_to_functional",
    origin="fxpass",
    statistics={
        "rewritten": "in-place calls replaced by their functional twin",
        "kept": "in-place calls left alone because a reader or the caller could tell",
    },
    keeps=("val", "stack_trace", "nn_module_stack", "provenance"),
)
def inplace_to_functional(gm: fx.GraphModule, ctx: PassContext) -> bool:
    """Replace in-place ops (``relu_``, ``add_``, ``x.mul_``, ``F.relu(inplace=True)``) by
    their functional twins where nothing can tell the difference.

    The functional twin is found by name (``aten.add_.Tensor`` -> ``aten.add.Tensor``, the
    same arguments) — no op list. A write is rewritten only when the written tensor is the
    graph's own (not an input, parameter or buffer, whose writes the caller sees), is not a
    view, has no view taken before the write (which would see the write), and the
    functional result has the same shape, dtype and device (``bf16.add_(fp32)`` stays).
    Readers after the write read the new value.

    Before / after::

        %mm = aten.mm(%x, %w)                     %mm = aten.mm(%x, %w)
        %relu_ = aten.relu_(%mm)          ->      %relu = aten.relu(%mm)
        %out = aten.add(%mm, 1)                   %out = aten.add(%relu, 1)
    """
    changed, editor = False, ctx.editor
    info: AliasInfo | None = None
    for node in list(gm.graph.nodes):
        written = written_args(node)
        call = _functional_call(node) if len(written) == 1 else None
        if call is None:
            continue
        if not node.args or node.args[0] is not written[0]:
            ctx.stat("kept")
            continue
        info = info or aliasing(gm)
        safe = _safe(node, written[0], info)
        if safe and editor.allow() and _rewrite(node, written[0], call, info, editor):
            ctx.stat("rewritten")
            changed, info = True, None
        else:
            ctx.stat("kept")
    return changed
