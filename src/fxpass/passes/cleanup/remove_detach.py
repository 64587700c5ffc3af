"""``remove_detach``: drop ``detach``, which only matters to autograd."""

from __future__ import annotations

import torch
from torch import fx

from ...core.analyses import aliasing, positions
from ...core.context import PassContext
from ...core.pass_registry import register
from ...fxutil.dialect import aten_op
from ._copies import input_becomes_output

__all__ = ["remove_detach"]

aten = torch.ops.aten
_DETACH_OPS = {aten.detach.default, aten.detach_copy.default, aten.detach_.default}
_DETACH_FUNCTIONS = {torch.detach, torch.Tensor.detach}


def _is_detach(node: fx.Node) -> bool:
    if node.op == "call_method":
        return node.target in ("detach", "detach_")
    return node.op == "call_function" and (
        aten_op(node.target) in _DETACH_OPS or node.target in _DETACH_FUNCTIONS
    )


@register(
    "remove_detach",
    origin="fxpass",
    statistics={"removed": "detach calls replaced by their input"},
    keeps="all",
    preserves=(positions, aliasing),
    edits="editor",
)
def remove_detach(gm: fx.GraphModule, ctx: PassContext) -> bool:
    """Replace ``detach`` (``aten.detach``, ``detach_copy``, ``detach_``, ``Tensor.detach``)
    by its input.

    ``detach`` returns its input's data without autograd history; in an inference graph, or
    a graph below autograd (export, AOT), that is the input itself. Do not run it on a
    Dynamo graph that autograd will differentiate: there ``detach`` stops gradients. An
    input never becomes a direct graph output (ExecuTorch's ``RemoveDetachPass``, made
    safe for backends that reject that).

    Before / after::

        %detach = aten.detach(%x)
        %mul = aten.mul(%detach, 2)       ->      %mul = aten.mul(%x, 2)
    """
    changed, editor = False, ctx.editor
    for node in list(gm.graph.nodes):
        if not _is_detach(node) or not isinstance(node.args[0], fx.Node):
            continue
        src = node.args[0]
        if input_becomes_output(node, src) or not editor.allow():
            continue
        editor.replace_all_uses(node, src, "remove_detach")
        ctx.stat("removed")
        changed = True
    return changed
