"""``remove_assert_ops``: drop the assertion nodes ``torch.export`` puts into graphs."""

from __future__ import annotations

import torch
from torch import fx
from torch.fx import Node

from ...core.analyses import aliasing, fake_values, positions
from ...core.context import PassContext
from ...core.pass_registry import register
from ...fxutil.dialect import aten_op
from ...fxutil.fx_internals import is_erased
from ...rewrite.rewriter import Rewriter
from ...rewrite.rule import DROPPABLE_USERS

__all__ = ["METADATA_ASSERTS", "SHAPE_ASSERTS", "remove_assert_ops"]

aten = torch.ops.aten

#: Checks of a tensor's dtype/device/layout that export adds after ``.to()``/``.float()``:
#: the users of inner nodes that rules erase with a match.
METADATA_ASSERTS = DROPPABLE_USERS

#: Runtime checks of symbolic-shape conditions, and range hints for unbacked sizes.
SHAPE_ASSERTS = frozenset(
    op
    for op in (
        getattr(aten, "_assert_scalar", None) and aten._assert_scalar.default,
        aten._assert_async.default,
        aten._assert_async.msg,
        aten.sym_constrain_range.default,
        aten.sym_constrain_range_for_size.default,
    )
    if op
)

_SCALAR_TYPES = (int, float, bool, torch.SymInt, torch.SymFloat, torch.SymBool)


def _feeds_only_checks(node: Node) -> bool:
    """A pure scalar computation (``sym_size``, a comparison) that nothing uses any more."""
    if node.op != "call_function" or node.users or node.is_impure():
        return False
    return isinstance(node.meta.get("val"), _SCALAR_TYPES)


@register(
    "remove_assert_ops",
    origin="fxpass",
    statistics={
        "removed": "assertion nodes removed",
        "removed_scalar": "scalar computations that only fed removed assertions",
    },
    keeps="all",
    preserves=(positions, aliasing, fake_values),
    edits="editor",
)
def remove_assert_ops(gm: fx.GraphModule, ctx: PassContext, *, shape_checks: bool = True) -> bool:
    """Remove export's assertion nodes, so patterns see the computation they guard.

    ``torch.export`` puts ``aten._assert_tensor_metadata`` after every ``.to()`` and
    ``.float()``: the assert hangs off an intermediate value (an RMSNorm's upcast, for
    one), so a fusion that insists the intermediate is used only inside its pattern finds
    nothing. The asserts return nothing and no node reads them; removing them changes no
    value. With ``shape_checks`` (the default) the runtime checks of symbolic-shape
    conditions go too (``_assert_scalar``, ``_assert_async``, ``sym_constrain_range*``),
    with the scalar comparisons that only fed them.

    Before / after::

        %h = aten._to_copy(%x, dtype=torch.float32)
        %a = aten._assert_tensor_metadata(%h, dtype=torch.float32)     (removed)
        %p = aten.pow(%h, 2)                          ->      %p = aten.pow(%h, 2)
    """
    targets = METADATA_ASSERTS | SHAPE_ASSERTS if shape_checks else METADATA_ASSERTS
    rw = Rewriter(gm, "remove_assert_ops", editor=ctx.editor)
    changed = False
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or aten_op(node.target) not in targets or node.users:
            continue
        inputs = node.all_input_nodes
        if not rw.erase(node, "remove_assert_ops"):
            continue
        changed = True
        ctx.stat("removed")
        stack = list(inputs)
        while stack:  # the scalar checks that computed the asserted condition
            n = stack.pop()
            if not is_erased(n) and _feeds_only_checks(n):
                more = n.all_input_nodes
                if rw.erase(n, "remove_assert_ops"):
                    ctx.stat("removed_scalar")
                    stack.extend(more)
    return changed
