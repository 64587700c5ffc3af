"""``dce``: dead code elimination that respects effects."""

from __future__ import annotations

import torch
from torch import fx
from torch._higher_order_ops.effects import _get_effect
from torch.fx.node import _side_effectful_functions

from ...core.analyses import aliasing, fake_values, positions, users
from ...core.context import PassContext
from ...core.pass_registry import register
from ...edit.alias import AliasInfo, written_args
from ...fxutil.dialect import aten_op

__all__ = ["dce", "has_effect"]


def has_effect(node: fx.Node, *, keep_rng: bool = True) -> bool:
    """Must ``node`` stay even when nobody reads its result?

    Placeholders and the output, ops that write memory (``Tensor(a!)`` in the schema, Python
    in-place calls), side effects torch knows (asserts, profiler ranges, ops registered as
    effectful, impure modules) and — unless ``keep_rng=False`` — random ops, which advance
    the generator that later random ops read.
    """
    if node.op in ("placeholder", "output"):
        return True
    if written_args(node):
        return True
    target = aten_op(node.target) if node.op == "call_function" else None
    if target is not node.target and isinstance(target, torch._ops.OpOverload):
        if keep_rng and torch.Tag.nondeterministic_seeded in target.tags:
            return True  # an Edge op: torch's check below knows only OpOverloads
        if _get_effect(target) is not None:
            return True
    return node.is_impure(impure_random=keep_rng)


def _only_writes(node: fx.Node, keep_rng: bool) -> bool:
    """Is writing memory the node's only effect (no side effect, no random draw)?"""
    target = aten_op(node.target)
    if node.op == "call_module" or target in _side_effectful_functions:
        return False
    if isinstance(target, torch._ops.OpOverload):
        random = torch.Tag.nondeterministic_seeded in target.tags
        return _get_effect(target) is None and not (random and keep_rng)
    return node.op == "call_method" or callable(target)


def _dead_store(node: fx.Node, info: AliasInfo, keep_rng: bool) -> bool:
    """A write to the graph's own memory that nothing reads afterwards."""
    written = info.written_by.get(node)
    if not written or info.external(written) or not _only_writes(node, keep_rng):
        return False
    return info.last_read(written) <= info.pos[node]  # the node itself reads at pos[node]


@register(
    "dce",
    origin="fxpass",
    statistics={"removed": "nodes erased because nothing used them"},
    keeps="all",
    preserves=(positions, users, aliasing, fake_values),
    edits="editor",
)
def dce(gm: fx.GraphModule, ctx: PassContext, *, keep_rng: bool = True) -> bool:
    """Remove nodes whose results nobody uses and that have no effect.

    Unused placeholders stay (they are the calling convention); see :func:`has_effect` for
    what else stays. A write is dropped too when it is a dead store: it writes only the
    graph's own memory (not an input, parameter or buffer), nothing reads that memory
    afterwards, none of it is returned, and writing is its only effect.
    ``keep_rng=False`` also drops unused random ops, which changes the values later random
    ops draw.

    Before / after::

        %sin = aten.sin(%x)               # unused           ->  (gone)
        %add_ = aten.add_(%x, 1)          # writes an input  ->  %add_ = aten.add_(%x, 1)
        %mul_ = aten.mul_(%tmp, 2)        # dead store       ->  (gone)
        %rand = aten.rand([4])            # unused, random   ->  %rand = aten.rand([4])
    """
    changed, editor = False, ctx.editor
    info = aliasing(gm)
    for node in reversed(list(gm.graph.nodes)):
        if node.users:
            continue
        if has_effect(node, keep_rng=keep_rng) and not _dead_store(node, info, keep_rng):
            continue
        if not editor.allow():
            continue
        editor.erase(node, "dce")
        ctx.stat("removed")
        changed = True
    return changed
