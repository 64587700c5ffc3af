"""``fix_functionalization``: functionalized mutating ops become in-place calls again."""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch import fx

from ...core.analyses import aliasing
from ...core.context import PassContext
from ...core.pass_registry import register
from ...edit.alias import (
    FUNCTIONAL_HOPS,
    AliasInfo,
    hop_name,
    lay_out_args,
    nodes_in,
    write_slots,
)
from ...edit.editor import Editor
from ...fxutil.ops import schema_of
from ...fxutil.values import fake_value

__all__ = ["fix_functionalization"]

aten = torch.ops.aten
_NAME = "fix_functionalization"


def _hop(node: fx.Node) -> str | None:
    name = hop_name(node)
    if name in FUNCTIONAL_HOPS and isinstance(node.args[0], torch._ops.OpOverload):
        return name
    return None


def _mutable(op: torch._ops.OpOverload) -> list[str]:
    """The names of the arguments ``op`` writes, in schema order."""
    return [name for _, name, _ in write_slots(op)]


class _Call:
    """One functionalized call, read back: the op, its arguments (mutable ones as views
    still to build), and the bases it writes."""

    def __init__(self, node: fx.Node, kind: str) -> None:
        self.node, self.kind = node, kind
        self.op: torch._ops.OpOverload = node.args[0]
        self.schema = schema_of(self.op)
        kwargs = dict(node.kwargs)
        returns = len(self.schema.returns)
        self.offset = returns if returns > 1 else 1  # outputs first, then the new bases
        self.views: dict[str, Any] = {}
        if kind == "auto_functionalized_v2":
            self.bases: list[fx.Node] = list(kwargs.pop("_all_bases"))
            kwargs.pop("_only_clone_these_bases", None)
            for name in _mutable(self.op):
                self.views[name] = self._read_view(kwargs, f"_{name}")
        else:
            self.bases = []
            for name in _mutable(self.op):
                value = kwargs.pop(name)
                self.views[name] = ("node", value)
                self.bases.append(value)
        self.kwargs = kwargs  # the op's other arguments, by name

    def _read_view(self, kwargs: dict, prefix: str) -> Any:
        if f"{prefix}_length" in kwargs:  # Tensor[]: one view per element
            length = kwargs.pop(f"{prefix}_length")
            if length is None:
                return None
            return [self._read_view(kwargs, f"{prefix}_{i}") for i in range(length)]
        index = kwargs.pop(f"{prefix}_base_index")
        if index is None:
            return None
        if kwargs.pop(f"{prefix}_alias", None) is not None:
            return ("alias", index)
        if f"{prefix}_storage_offset" in kwargs:
            geometry = [kwargs.pop(f"{prefix}_{k}") for k in ("size", "stride", "storage_offset")]
            return ("as_strided", index, *geometry)
        if f"{prefix}_slice_dim" in kwargs:
            where = [kwargs.pop(f"{prefix}_slice_{k}") for k in ("dim", "start", "end")]
            return ("slice", index, *where)
        return ("base", index)

    def build_view(self, view: Any, editor: Editor) -> Any:
        """The node (or list) the in-place op is called with for one mutable argument."""
        if view is None:
            return None
        if isinstance(view, list):
            return [self.build_view(v, editor) for v in view]
        kind, rest = view[0], view[1:]
        if kind == "node":
            return rest[0]
        base = self.bases[rest[0]]
        if kind == "base":
            return base
        target = {"alias": aten.alias.default, "as_strided": aten.as_strided.default}.get(
            kind, aten.slice.Tensor
        )
        args = (base,) if kind == "alias" else (base, *rest[1:])
        return editor.insert(
            target,
            args,
            rule="view_of_base",
            origin=[self.node],
            before=self.node,
            val=fake_value(target, args, {}),
        )


def _writebacks(call: _Call) -> dict[fx.Node, fx.Node]:
    """``copy_(input, new_value)`` nodes that write a new base back into a graph input
    (AOTAutograd's input mutations), by base."""
    found = {}
    for j, base in enumerate(call.bases):
        for user in call.node.users:
            if user.target is operator.getitem and user.args[1] == call.offset + j:
                for reader in user.users:
                    if reader.target is aten.copy_.default and reader.args[:2] == (base, user):
                        found[base] = reader
    return found


def _reinplaceable(call: _Call, info: AliasInfo, writebacks: dict) -> bool:
    """Would writing the bases in place go unnoticed? No base is read after the call (but
    by its write-back), the caller's memory is written only where a write-back copies the
    new value into it anyway, and no base shares memory with another argument."""
    here = info.pos[call.node]
    seen: frozenset[fx.Node] = frozenset()
    others = frozenset().union(*(info.roots(n) for n in nodes_in(call.kwargs)))
    for base in call.bases:
        roots = info.roots(base)
        if roots & seen or roots & others:
            return False
        seen |= roots
        if info.external(roots) and base not in writebacks:
            return False
        for alias in info.aliases(roots):
            for user in alias.users:
                later = info.pos.get(user, here) > here
                if later and user is not writebacks.get(base):
                    return False
    return True


def _rewrite(call: _Call, writebacks: dict, ctx: PassContext) -> None:
    node, editor = call.node, ctx.editor
    with editor.change("replace", _NAME, [node]) as change:
        named = dict(call.kwargs)
        for name, view in call.views.items():
            named[name] = call.build_view(view, editor)
        args, kwargs = lay_out_args(call.schema, named)
        inplace = editor.insert(
            call.op, tuple(args), kwargs, rule="reinplace", origin=[node], before=node
        )
        _rewire(call, writebacks, named, inplace, ctx)
        change.new = [inplace]


def _rewire(call: _Call, writebacks: dict, named: dict, inplace: fx.Node, ctx: PassContext) -> None:
    """Readers of the call's results read the in-place call or the bases it writes."""
    node, editor = call.node, ctx.editor
    returns = len(call.schema.returns)
    for user in list(node.users):
        index = user.args[1]
        if index >= call.offset:  # a new base: the base itself, now written in place
            j = index - call.offset
            if call.kind == "auto_functionalized_v2":
                new = call.bases[j]
            else:
                new = named[_mutable(call.op)[j]]
            editor.replace_all_uses(user, new, _NAME)
        elif returns == 1:
            editor.replace_all_uses(user, inplace, _NAME)
        else:
            editor.set_args(user, (inplace, index), rule=_NAME)
    for copy in writebacks.values():
        if copy.args[0] is copy.args[1]:  # the write-back now copies a tensor into itself
            editor.replace_all_uses(copy, copy.args[0], _NAME)
            ctx.stat("copies_removed")
    inplace.meta["val"] = node.meta.get("val", (None,))[0] if returns == 1 else None
    editor.erase(node, _NAME)


@register(
    "fix_functionalization",
    origin="fxpass",
    statistics={
        "reinplaced": "functionalized calls turned back into in-place calls",
        "kept": "functionalized calls left alone because a reader or the caller could tell",
        "copies_removed": "write-back copies made redundant",
    },
    keeps=("val", "stack_trace", "nn_module_stack", "provenance"),
)
def fix_functionalization(gm: fx.GraphModule, ctx: PassContext) -> bool:
    """Turn ``auto_functionalized`` / ``auto_functionalized_v2`` calls of mutating ops back
    into in-place calls where nothing can tell.

    Functionalization (export, AOTAutograd) wraps every op that writes its arguments
    (``Tensor(a!)`` in its schema — ``fxpass::fused_add_rmsnorm_``, a user's custom op) in
    a higher-order op that clones the written arguments, calls the op on the clones and
    returns the new values. Backends want the in-place call (TensorRT-LLM's fused
    ``flashinfer_fused_add_rmsnorm``). A call is put back in place when no base it writes
    is read after it (other than by AOTAutograd's write-back ``copy_`` into a graph input,
    which then goes), it writes the caller's memory only where such a write-back exists,
    and its written arguments share memory with nothing else it reads. Views of bases
    (``auto_functionalized_v2``'s view records) are rebuilt with ``alias``, ``slice`` or
    ``as_strided``. No list of ops: the schemas' alias annotations say what is written.

    Before / after::

        %af = auto_functionalized_v2(fxpass.fused_add_rmsnorm_, weight=%w, eps=1e-06,
                  _x_base_index=0, _residual_base_index=1, _all_bases=[%x, %r])
        %x_new = getitem(%af, 1)               ->    %op = fxpass.fused_add_rmsnorm_(%x, %r, %w, 1e-06)
        %r_new = getitem(%af, 2)                     return (%x, %r)
        return (%x_new, %r_new)
    """
    changed = False
    info: AliasInfo | None = None
    editor = ctx.editor
    for node in list(gm.graph.nodes):
        kind = _hop(node)
        if kind is None:
            continue
        if not all(u.target is operator.getitem for u in node.users):
            ctx.stat("kept")
            continue
        info = info or aliasing(gm)
        call = _Call(node, kind)
        writebacks = _writebacks(call)
        if _reinplaceable(call, info, writebacks) and editor.allow():
            _rewrite(call, writebacks, ctx)
            ctx.stat("reinplaced")
            changed, info = True, None
        else:
            ctx.stat("kept")
    return changed
