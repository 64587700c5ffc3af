"""``erase_copy``: forward a copy's source to its readers and drop the copy when unobservable."""

from __future__ import annotations

import torch
from torch import fx

from ...core.analyses import aliasing
from ...core.context import PassContext
from ...core.pass_registry import register
from ...edit.alias import AliasInfo, aliased_args
from ...edit.editor import Editor
from ...fxutil.dialect import aten_op
from ...fxutil.values import node_val
from ._copies import copy_is_unobservable, same_layout, view_is_replaceable

__all__ = ["erase_copy"]

aten = torch.ops.aten


def _copy_into(node: fx.Node) -> tuple[fx.Node, fx.Node] | None:
    """``(dst, src)`` of an in-place copy ``dst.copy_(src)``, else None."""
    is_copy_ = aten_op(node.target) is aten.copy_.default or (
        node.op == "call_method" and node.target == "copy_"
    )
    if node.op in ("call_function", "call_method") and is_copy_ and len(node.args) >= 2:
        dst, src = node.args[:2]
        if isinstance(dst, fx.Node) and isinstance(src, fx.Node):
            return dst, src
    return None


def _forward_readers(
    copy: fx.Node, dst: fx.Node, src: fx.Node, info: AliasInfo, editor: Editor
) -> int:
    """Point readers of ``dst`` after ``copy`` at ``src``; returns how many were changed."""
    moved = 0
    for old in (dst, copy):
        for user in list(old.users):
            if user is copy or user.op == "output" or info.pos[user] < info.pos[copy]:
                continue
            if old in aliased_args(user) and info.escapes(info.roots(user)):
                continue  # a view of it is returned: keep returning the copy's memory
            if not editor.allow():
                continue
            editor.replace_input(user, old, src, rule="erase_copy")
            moved += 1
    return moved


def _erase_in_place(
    copy: fx.Node, dst: fx.Node, src: fx.Node, info: AliasInfo, ctx: PassContext
) -> bool:
    editor = ctx.editor
    if not same_layout(node_val(dst), node_val(src)):
        return False
    if info.written(info.roots(dst) | info.roots(src), after=info.pos[copy], ignore=copy):
        return False  # a later write would see (or hide) the difference
    moved = _forward_readers(copy, dst, src, info, editor)
    if moved:
        ctx.stat("readers_forwarded", moved)
    dst_roots = info.roots(dst)
    read_later = info.last_read(dst_roots) > info.pos[copy]
    gone = not info.external(dst_roots) and not read_later
    if gone and not copy.users and editor.allow():
        editor.erase(copy, "erase_copy")
        ctx.stat("copies_erased")
    return bool(moved) or gone


@register(
    "erase_copy",
    origin="fxpass",
    statistics={
        "readers_forwarded": "reads of a copy's destination that now read its source",
        "copies_erased": "copies removed",
    },
    keeps="all",
    edits="editor",
)
def erase_copy(gm: fx.GraphModule, ctx: PassContext) -> bool:
    """Forward copies' sources to their readers; drop copies nothing can observe.

    SGLang's ``EraseCopy``, made safe and general. For an in-place copy ``dst.copy_(src)``
    (same shape, dtype and strides) that neither ``dst`` nor ``src`` is written after:

    * readers of ``dst`` after the copy read ``src`` instead (the graph output keeps
      returning ``dst``);
    * the copy itself goes when ``dst`` is the graph's own memory (not an input, parameter
      or buffer) and nothing reads it afterwards (``dce`` then drops its allocation).

    A functional ``aten.copy(dst, src)`` with ``src``'s layout is replaced by ``src`` when
    nothing can observe that it was a copy (see ``remove_noop`` for ``clone``).

    Before / after::

        %buf = aten.empty([8, 64])
        %copy_ = aten.copy_(%buf, %x)      ->      %y = aten.relu(%x)
        %y = aten.relu(%buf)
    """
    changed, editor = False, ctx.editor
    info: AliasInfo | None = None
    for node in list(gm.graph.nodes):
        into = _copy_into(node)
        if into is not None:
            info = info or aliasing(gm)
            if _erase_in_place(node, *into, info, ctx):
                changed, info = True, None
        elif aten_op(node.target) is aten.copy.default and isinstance(node.args[1], fx.Node):
            info = info or aliasing(gm)
            src = node.args[1]
            ok = copy_is_unobservable(node, src, info) and view_is_replaceable(node, src)
            if ok and editor.allow():
                editor.replace_all_uses(node, src, "erase_copy")
                ctx.stat("copies_erased")
                changed, info = True, None
    return changed
