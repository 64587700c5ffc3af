"""A rank's rewrite as data, and the one executor that applies it.

A strategy works out what one rank changes without touching the graph: an
:class:`EditScript`, every edit by node name with the rank's numbers in it —

* :class:`SetArg`: a constant argument that names a global size (a reshape's heads, a
  split's sizes) takes the rank's value;
* :class:`Bypass`: the readers of an add read its first input instead (a bias added to
  partial sums, which one rank of each group adds);
* :class:`Reduce`: an all-reduce after a value, for the readers that need it whole (a
  row-parallel matmul's bias, if any, is added after the reduction; a scale after it);
* :class:`MaskedLookup`: a vocab-parallel embedding looks up the rank's rows only, then
  all-reduces;
* :class:`Gather`: an all-gather before the graph returns a sharded value;
* :class:`TakePiece`: a reader takes the rank's piece of a replicated value;
* :class:`SliceWeight`: a weight keeps the rank's piece.

:func:`apply_edits` applies a script: every node through the run's editor (``ctx.editor``:
provenance, the report's change list, the debug counter, which counts each collective
edit as one change) and :mod:`.collectives`' node builders, every weight where the program
keeps it (``ctx.program``, :mod:`.weights`), and ``meta['val']`` propagated again once at
the end. A script that names a node the graph lacks fails before any edit; an application
that fails leaves the graph and the weights as they were.

>>> script = EditScript([Reduce("linear_3", "0")], [SliceWeight("w", Shard(1), 0, 2)])  # doctest: +SKIP
>>> apply_edits(gm, script, ctx, "tensor_parallel")                 # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import fx

from ..core.snapshot import GraphSnapshot
from ..edit.editor import Editor
from ..fxutil.dialect import aten_op
from ..fxutil.ops import schema_of
from ..rewrite.metadata import fake_mode, repropagate
from . import collectives
from .collectives import Inserter
from .placement import Shard, local_slice
from .plan import PlanError
from .weights import Replaced, current_weight

__all__ = [
    "Bypass",
    "EditScript",
    "Gather",
    "MaskedLookup",
    "Reduce",
    "SetArg",
    "SliceWeight",
    "TakePiece",
    "apply_edits",
]

aten = torch.ops.aten


@dataclass(frozen=True)
class SetArg:
    """``node``'s argument at ``where`` (``("args", i)`` or ``("kwargs", key)``) becomes
    ``value``."""

    node: str
    where: tuple[str, Any]
    value: Any
    counted: ClassVar[bool] = False  # one change of the debug counter's
    named: ClassVar[tuple[str, ...]] = ("node",)  # the fields that name nodes


@dataclass(frozen=True)
class Bypass:
    """The readers of ``node`` read its first argument; ``node`` goes."""

    node: str
    counted: ClassVar[bool] = False
    named: ClassVar[tuple[str, ...]] = ("node",)


@dataclass(frozen=True)
class Reduce:
    """``wait_tensor(all_reduce(value, op, group))``, times ``scale``, read by ``readers``
    (empty: every reader of ``value`` when the edit is made). ``bias``: ``value`` is a
    matmul whose bias is taken out and added after the reduction."""

    value: str
    group: str
    op: str = "sum"
    scale: float = 1.0
    readers: tuple[str, ...] = ()
    bias: str | None = None
    counted: ClassVar[bool] = True
    named: ClassVar[tuple[str, ...]] = ("value", "readers", "bias")


@dataclass(frozen=True)
class MaskedLookup:
    """The embedding lookup ``node`` holds the rows ``[start, stop)``: ids outside them
    look up row 0 and are zeroed, and the result is all-reduced over ``group``."""

    node: str
    start: int
    stop: int
    group: str
    counted: ClassVar[bool] = True
    named: ClassVar[tuple[str, ...]] = ("node",)


@dataclass(frozen=True)
class Gather:
    """The graph returns the all-gather over ``group`` of ``value`` (each rank's piece, of
    shape ``local``, ``count`` pieces along ``dim``)."""

    value: str
    dim: int
    local: tuple[int, ...]
    count: int
    group: str
    counted: ClassVar[bool] = True
    named: ClassVar[tuple[str, ...]] = ("value",)


@dataclass(frozen=True)
class TakePiece:
    """``reader`` reads ``value[start:stop]`` along ``dim`` instead of ``value``."""

    reader: str
    value: str
    dim: int
    start: int
    stop: int
    counted: ClassVar[bool] = False
    named: ClassVar[tuple[str, ...]] = ("reader", "value")


@dataclass(frozen=True)
class SliceWeight:
    """The weight ``node`` keeps piece ``index`` of ``count`` under ``shard``: in the
    program's state, or with slice nodes when the graph's weights are its inputs."""

    node: str
    shard: Shard
    index: int
    count: int
    named: ClassVar[tuple[str, ...]] = ("node",)


@dataclass
class EditScript:
    """One rank's rewrite: the graph ``edits`` in order, then the ``weights`` cut."""

    edits: list[Any] = field(default_factory=list)
    weights: list[SliceWeight] = field(default_factory=list)

    def names(self) -> set[str]:
        """Every node the script names."""
        out: set[str] = set()
        for e in [*self.edits, *self.weights]:
            for f in e.named:
                name = getattr(e, f)
                out.update(name if isinstance(name, tuple) else () if name is None else (name,))
        return out


# ----- the executor -----------------------------------------------------------------------------
def apply_edits(gm: fx.GraphModule, script: EditScript, ctx: Any, rule: str) -> tuple[int, int]:
    """Apply ``script`` to ``gm`` through the run's editor (``ctx.editor``), cutting the
    weights of the program it runs on (``ctx.program``) under ``rule``; returns the bytes
    of the cut weights before and after. On a failure the graph and the weights are put
    back as they were and the error is raised again."""
    missing = sorted(script.names() - {n.name for n in gm.graph.nodes})
    if missing:
        raise PlanError(
            f"the rank's edits name node '{missing[0]}', which the graph does not have "
            "(were they made for another program?)"
        )
    editor, nodes = ctx.editor, {n.name: n for n in gm.graph.nodes}
    snapshot, replaced = GraphSnapshot.take(gm), Replaced(gm, ctx.program)
    try:
        for edit in script.edits:
            if edit.counted and not editor.allow():
                continue
            match edit:
                case SetArg():
                    _set_arg(editor, edit, nodes, rule)
                case Bypass():
                    editor.replace_all_uses(nodes[edit.node], nodes[edit.node].args[0], rule)
                case Reduce():
                    _reduce(editor, edit, nodes, rule)
                case MaskedLookup():
                    _masked_lookup(editor, edit, nodes, rule)
                case Gather():
                    _gather(editor, edit, nodes, rule)
                case TakePiece():
                    _take_piece(editor, edit, nodes, rule)
                case _:
                    raise TypeError(f"apply_edits: {type(edit).__name__} is no edit")
        mode = fake_mode(gm)
        sizes = _slice_weights(editor, gm, script.weights, nodes, replaced, mode, rule)
        repropagate(gm, mode, {nodes[w.node] for w in script.weights})
        gm.graph.lint()
    except BaseException:
        replaced.restore()
        snapshot.restore()
        raise
    return sizes


def _set_arg(editor: Editor, e: SetArg, nodes: dict, rule: str) -> None:
    node = nodes[e.node]
    kind, key = e.where
    if kind == "args":
        args = list(node.args)
        args[key] = e.value
        editor.set_args(node, tuple(args), rule=rule)
    else:
        editor.set_args(node, kwargs={**node.kwargs, key: e.value}, rule=rule)


def _unbias(editor: Editor, node: fx.Node, rule: str) -> fx.Node:
    """``node`` without its bias: an ``addmm`` becomes an ``mm``, a ``linear`` loses it."""
    if aten_op(node.target) is aten.addmm.default:
        new = editor.insert(aten.mm.default, node.args[1:], rule=rule, origin=[node],
                            after=node)  # fmt: skip
        editor.replace_all_uses(node, new, rule)
        return new
    kwargs = {k: v for k, v in node.kwargs.items() if k != "bias"}
    editor.set_args(node, node.args[:2], kwargs, rule=rule)
    return node


def _reduce(editor: Editor, e: Reduce, nodes: dict, rule: str) -> None:
    value = nodes[e.value]
    if e.bias is not None:
        value = _unbias(editor, value, rule)
    readers = [nodes[r] for r in e.readers] or list(value.users)
    put = Inserter(editor, rule, [value], after=value)
    out = collectives.all_reduce(put, value, e.group, e.op)
    if e.scale != 1.0:
        out = put(aten.mul.Tensor, out, e.scale)
    if e.bias is not None:
        out = put(aten.add.Tensor, out, nodes[e.bias])
    out = _writable(put, out, readers, value)
    for u in readers:
        editor.replace_input(u, value, out, rule=rule)


def _masked_lookup(editor: Editor, e: MaskedLookup, nodes: dict, rule: str) -> None:
    node = nodes[e.node]
    ids = node.args[1]
    put = Inserter(editor, rule, [node], before=node)
    inside = put(aten.logical_and.default, put(aten.ge.Scalar, ids, e.start),
                 put(aten.lt.Scalar, ids, e.stop))  # fmt: skip
    shifted = put(aten.mul.Tensor, put(aten.sub.Tensor, ids, e.start), inside)
    editor.set_args(node, (node.args[0], shifted), {}, rule=rule)  # padding_idx: gradients
    users = list(node.users)
    # a product with the mask, not masked_fill: Inductor decomposes masked_fill before
    # its post-grad passes, where this rewrite may run
    after = Inserter(editor, rule, [node], after=node)
    zeroed = after(aten.mul.Tensor, node, after(aten.unsqueeze.default, inside, -1))
    out = collectives.all_reduce(after, zeroed, e.group)
    for u in users:
        editor.replace_input(u, node, out, rule=rule)


def _gather(editor: Editor, e: Gather, nodes: dict, rule: str) -> None:
    value = nodes[e.value]
    out = value.graph.output_node()
    put = Inserter(editor, rule, [value], before=out)
    full = collectives.all_gather(put, value, list(e.local), e.dim, e.count, e.group)
    editor.replace_input(out, value, full, rule=rule)


def _take_piece(editor: Editor, e: TakePiece, nodes: dict, rule: str) -> None:
    reader, value = nodes[e.reader], nodes[e.value]
    put = Inserter(editor, rule, [value], before=reader)
    piece = put(aten.slice.Tensor, value, e.dim, e.start, e.stop)
    editor.replace_input(reader, value, piece, rule=rule)


def _writes_first(node: fx.Node) -> bool:
    schema = schema_of(node.target)
    if schema is None or not schema.arguments:
        return False
    info = schema.arguments[0].alias_info
    return info is not None and info.is_write


def _writable(put: Inserter, out: fx.Node, readers: list[fx.Node], value: fx.Node) -> fx.Node:
    """``out``, cloned when a reader writes into ``value`` in place (a collective's result
    is a view autograd forbids writing)."""
    if any(_writes_first(u) and u.args[0] is value for u in readers):
        return put(aten.clone.default, out)
    return out


# ----- weights ----------------------------------------------------------------------------------
def _slice_in_graph(editor: Editor, node: fx.Node, w: SliceWeight, rule: str) -> None:
    shard = w.shard
    size = int(node.meta["val"].shape[shard.dim])
    users = list(node.users)
    put = Inserter(editor, rule, [node], after=node)
    pieces, start = [], 0
    for p in shard.parts or (size,):
        chunk = p // w.count
        begin = start + w.index * chunk
        pieces.append(put(aten.slice.Tensor, node, shard.dim, begin, begin + chunk))
        start += p
    out = pieces[0] if len(pieces) == 1 else put(aten.cat.default, pieces, shard.dim)
    for u in users:
        editor.replace_input(u, node, out, rule=rule)


def _slice_weights(editor: Editor, gm: fx.GraphModule, weights: list[SliceWeight],
                   nodes: dict, replaced: Replaced, mode: Any, rule: str) -> tuple[int, int]:  # fmt: skip
    """Cut every weight; returns (bytes before, bytes after) of those the program holds."""
    before = after = 0
    for w in weights:
        node = nodes[w.node]
        value = current_weight(gm, node, replaced.program)
        if value is None:
            _slice_in_graph(editor, node, w, rule)
            continue
        new = local_slice(value.detach(), w.shard, w.index, w.count)
        before += value.numel() * value.element_size()
        after += new.numel() * new.element_size()
        replaced.replace(node, new, mode)
    return before, after
