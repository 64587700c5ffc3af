"""The edits of a rank's rewrite: each one change by node name, with the rank's numbers in
it, that knows how to make itself.

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
* the experts' edits: :class:`Rotate` (expert ids count from the rank's first expert),
  :class:`Clamp` (ids that gather from an expert stack stay in its kept rows),
  :class:`FirstOffsets` (a grouped matmul runs the kept experts' rows),
  :class:`MaskRows` (the rows of other ranks' experts are zeroed), :class:`ZeroExpert` (a
  separate expert another rank runs gives zeros, its nodes go);
* :class:`SliceWeight`: a weight keeps the rank's piece; :class:`KeepRows`: an expert
  stack keeps the rank's experts.

Each is an :class:`Edit` (``edit.apply_to(at)`` makes it) or, for a weight, a :class:`Cut`
(``cut(at)``, after the graph's edits), ``at`` the :class:`Application` under
way (the graph's nodes by name, the editor, the rule, the weights replaced): nodes through
the run's editor and :mod:`.collectives`' node builders, a weight where the program keeps
it (:mod:`.weights`). ``counted``: the debug counter counts the edit as one change (the
collectives); ``named``: the fields that name nodes. A strategy puts edits in an
:class:`~.edit_script.EditScript`, which :func:`~.edit_script.apply_edits` applies.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import fx

from ..fxutil.dialect import aten_op
from ..fxutil.ops import schema_of
from . import collectives
from .collectives import Inserter
from .placement import Shard, local_slice
from .plan import PlanError
from .weights import Replaced, current_weight

__all__ = [
    "Application",
    "Bypass",
    "Clamp",
    "Cut",
    "Edit",
    "FirstOffsets",
    "Gather",
    "KeepRows",
    "MaskRows",
    "MaskedLookup",
    "Reduce",
    "Rotate",
    "SetArg",
    "SliceWeight",
    "TakePiece",
    "ZeroExpert",
]

aten = torch.ops.aten


class Application:
    """One script being applied to one graph: its nodes by name (``at[name]``), the run's
    ``editor``, the ``rule`` its edits are recorded under, the program whose weights it
    cuts (``program``) and the weights replaced (:class:`~.weights.Replaced`: to put back
    on a failure, with their bytes)."""

    def __init__(self, gm: fx.GraphModule, ctx: Any, rule: str) -> None:
        self.gm, self.editor, self.rule, self.program = gm, ctx.editor, rule, ctx.program
        self.nodes = {n.name: n for n in gm.graph.nodes}
        self.replaced = Replaced(gm, ctx.program)
        self.mode: Any = None  # the graph's fake mode, once the weights are cut

    def __getitem__(self, name: str) -> fx.Node:
        return self.nodes[name]


class Edit:
    """One edit of a rank's rewrite (see the module): ``apply_to(at)`` makes it."""

    #: the debug counter counts it as one change (the collectives' edits)
    counted: ClassVar[bool] = False
    #: the fields that name nodes (a name, or a tuple of names)
    named: ClassVar[tuple[str, ...]] = ("node",)

    def apply_to(self, at: Application) -> None:
        raise NotImplementedError


@dataclass(frozen=True)
class SetArg(Edit):
    """``node``'s argument at ``where`` (``("args", i)`` or ``("kwargs", key)``) becomes
    ``value``."""

    node: str
    where: tuple[str, Any]
    value: Any

    def apply_to(self, at: Application) -> None:
        node = at[self.node]
        kind, key = self.where
        if kind == "args":
            args = list(node.args)
            args[key] = self.value
            at.editor.set_args(node, tuple(args), rule=at.rule)
        else:
            at.editor.set_args(node, kwargs={**node.kwargs, key: self.value}, rule=at.rule)


@dataclass(frozen=True)
class Bypass(Edit):
    """The readers of ``node`` read its first argument; ``node`` goes."""

    node: str

    def apply_to(self, at: Application) -> None:
        at.editor.replace_all_uses(at[self.node], at[self.node].args[0], at.rule)


@dataclass(frozen=True)
class Reduce(Edit):
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

    def apply_to(self, at: Application) -> None:
        value = at[self.value]
        if self.bias is not None:
            value = _unbias(at, value)
        readers = [at[r] for r in self.readers] or list(value.users)
        put = Inserter(at.editor, at.rule, [value], after=value)
        out = collectives.all_reduce(put, value, self.group, self.op)
        if self.scale != 1.0:
            out = put(aten.mul.Tensor, out, self.scale)
        if self.bias is not None:
            out = put(aten.add.Tensor, out, at[self.bias])
        # a reader that writes into the value in place gets a copy: a collective's result
        # is a view autograd forbids writing into
        if any(_writes_first(u) and u.args[0] is value for u in readers):
            out = put(aten.clone.default, out)
        for u in readers:
            at.editor.replace_input(u, value, out, rule=at.rule)


@dataclass(frozen=True)
class MaskedLookup(Edit):
    """The embedding lookup ``node`` holds the rows ``[start, stop)``: ids outside them
    look up row 0 and are zeroed, and the result is all-reduced over ``group``."""

    node: str
    start: int
    stop: int
    group: str
    counted: ClassVar[bool] = True

    def apply_to(self, at: Application) -> None:
        node = at[self.node]
        ids = node.args[1]
        put = Inserter(at.editor, at.rule, [node], before=node)
        inside = put(aten.logical_and.default, put(aten.ge.Scalar, ids, self.start),
                     put(aten.lt.Scalar, ids, self.stop))  # fmt: skip
        shifted = put(aten.mul.Tensor, put(aten.sub.Tensor, ids, self.start), inside)
        at.editor.set_args(node, (node.args[0], shifted), {}, rule=at.rule)  # padding_idx: grads
        users = list(node.users)
        # a product with the mask, not masked_fill: Inductor decomposes masked_fill before
        # its post-grad passes, where this rewrite may run
        after = Inserter(at.editor, at.rule, [node], after=node)
        zeroed = after(aten.mul.Tensor, node, after(aten.unsqueeze.default, inside, -1))
        out = collectives.all_reduce(after, zeroed, self.group)
        for u in users:
            at.editor.replace_input(u, node, out, rule=at.rule)


@dataclass(frozen=True)
class Gather(Edit):
    """The graph returns the all-gather over ``group`` of ``value`` (each rank's piece, of
    shape ``local``, ``count`` pieces along ``dim``)."""

    value: str
    dim: int
    local: tuple[int, ...]
    count: int
    group: str
    counted: ClassVar[bool] = True
    named: ClassVar[tuple[str, ...]] = ("value",)

    def apply_to(self, at: Application) -> None:
        value = at[self.value]
        out = value.graph.output_node()
        put = Inserter(at.editor, at.rule, [value], before=out)
        full = collectives.all_gather(put, value, list(self.local), self.dim, self.count,
                                      self.group)  # fmt: skip
        at.editor.replace_input(out, value, full, rule=at.rule)


@dataclass(frozen=True)
class TakePiece(Edit):
    """``reader`` reads ``value[start:stop]`` along ``dim`` instead of ``value``."""

    reader: str
    value: str
    dim: int
    start: int
    stop: int
    named: ClassVar[tuple[str, ...]] = ("reader", "value")

    def apply_to(self, at: Application) -> None:
        reader, value = at[self.reader], at[self.value]
        put = Inserter(at.editor, at.rule, [value], before=reader)
        piece = put(aten.slice.Tensor, value, self.dim, self.start, self.stop)
        at.editor.replace_input(reader, value, piece, rule=at.rule)


@dataclass(frozen=True)
class Rotate(Edit):
    """``readers`` read ``(ids - first) mod experts`` instead of ``ids``."""

    ids: str
    first: int
    experts: int
    readers: tuple[str, ...]
    named: ClassVar[tuple[str, ...]] = ("ids", "readers")

    def apply_to(self, at: Application) -> None:
        ids = at[self.ids]
        put = Inserter(at.editor, at.rule, [ids], after=ids)
        rotated = put(aten.remainder.Scalar, put(aten.sub.Tensor, ids, self.first), self.experts)
        for name in self.readers:
            at.editor.replace_input(at[name], ids, rotated, rule=at.rule)


@dataclass(frozen=True)
class Clamp(Edit):
    """The expert ids the gather ``node`` indexes with are clamped to ``[0, high]``."""

    node: str
    high: int

    def apply_to(self, at: Application) -> None:
        node = at[self.node]
        (index,) = node.args[1]
        put = Inserter(at.editor, at.rule, [node], before=node)
        clamped = put(aten.clamp.default, index, None, self.high)
        at.editor.set_args(node, (node.args[0], [clamped]), rule=at.rule)


@dataclass(frozen=True)
class FirstOffsets(Edit):
    """The grouped matmul ``node`` reads the first ``count`` of its offsets."""

    node: str
    count: int

    def apply_to(self, at: Application) -> None:
        node = at[self.node]
        put = Inserter(at.editor, at.rule, [node], before=node)
        args = list(node.args)
        where = 2 if len(args) > 2 else None
        offs = args[2] if where else node.kwargs["offs"]
        first = put(aten.slice.Tensor, offs, 0, 0, self.count)
        if where:
            args[2] = first
            at.editor.set_args(node, tuple(args), rule=at.rule)
        else:
            at.editor.set_args(node, kwargs={**node.kwargs, "offs": first}, rule=at.rule)


@dataclass(frozen=True)
class MaskRows(Edit):
    """The readers of ``value`` read it with the rows whose expert id (``ids``, rotated) is
    not below ``kept`` zeroed (all of them when ``kept`` is 0)."""

    value: str
    ids: str
    kept: int
    named: ClassVar[tuple[str, ...]] = ("value", "ids")

    def apply_to(self, at: Application) -> None:
        value, ids = at[self.value], at[self.ids]
        users = list(value.users)
        put = Inserter(at.editor, at.rule, [value], after=value)
        flat = ids if ids.meta["val"].dim() == 1 else put(aten.reshape.default, ids, [-1])
        mine = put(aten.lt.Scalar, flat, self.kept)
        rank = value.meta["val"].dim()
        if rank > 1:
            mine = put(aten.view.default, mine, [int(flat.meta["val"].numel()), *[1] * (rank - 1)])
        out = put(aten.where.ScalarOther, mine, value, 0.0)
        for u in users:
            at.editor.replace_input(u, value, out, rule=at.rule)


@dataclass(frozen=True)
class ZeroExpert(Edit):
    """The readers of a separate expert's ``output`` read zeros of its shape; of ``body``,
    in that order, each node nothing reads any more goes."""

    output: str
    body: tuple[str, ...]
    named: ClassVar[tuple[str, ...]] = ("output", "body")

    def apply_to(self, at: Application) -> None:
        out = at[self.output]
        val = out.meta["val"]
        zeros = at.editor.insert(aten.zeros.default, (list(val.shape),),
                                 {"dtype": val.dtype, "device": val.device}, rule=at.rule,
                                 origin=[out], after=out, val=val)  # fmt: skip
        at.editor.replace_all_uses(out, zeros, at.rule)
        for name in self.body:
            if not at[name].users:
                at.editor.erase(at[name], at.rule)


# ----- the weights ------------------------------------------------------------------------------
class Cut:
    """One weight of a rank's rewrite: ``cut(at)`` keeps the rank's piece of it, once the
    graph's edits are made (``at.mode``, the graph's fake mode, gives its new value)."""

    named: ClassVar[tuple[str, ...]] = ("node",)

    def cut(self, at: Application) -> None:
        raise NotImplementedError


@dataclass(frozen=True)
class SliceWeight(Cut):
    """The weight ``node`` keeps piece ``index`` of ``count`` under ``shard``: in the
    program's state, or with slice nodes when the graph's weights are its inputs."""

    node: str
    shard: Shard
    index: int
    count: int

    def cut(self, at: Application) -> None:
        node = at[self.node]
        value = current_weight(at.gm, node, at.program)
        if value is not None:
            at.replaced.replace(
                node, local_slice(value.detach(), self.shard, self.index, self.count), at.mode
            )
            return
        shard, users = self.shard, list(node.users)
        size = int(node.meta["val"].shape[shard.dim])
        put = Inserter(at.editor, at.rule, [node], after=node)
        pieces, start = [], 0
        for p in shard.parts or (size,):
            chunk = p // self.count
            begin = start + self.index * chunk
            pieces.append(put(aten.slice.Tensor, node, shard.dim, begin, begin + chunk))
            start += p
        out = pieces[0] if len(pieces) == 1 else put(aten.cat.default, pieces, shard.dim)
        for u in users:
            at.editor.replace_input(u, node, out, rule=at.rule)


@dataclass(frozen=True)
class KeepRows(Cut):
    """The expert stack ``node`` keeps its rows ``[start, stop)`` (it must be a tensor of
    the program, not a graph input)."""

    node: str
    start: int
    stop: int

    def cut(self, at: Application) -> None:
        node = at[self.node]
        value = current_weight(at.gm, node, at.program)
        if value is None:
            raise PlanError(f"expert parallelism needs the expert weights in the program; "
                            f"'{self.node}' is a graph input")  # fmt: skip
        at.replaced.replace(
            node, value.detach().narrow(0, self.start, self.stop - self.start).clone(), at.mode
        )


def _unbias(at: Application, node: fx.Node) -> fx.Node:
    """``node`` without its bias: an ``addmm`` becomes an ``mm``, a ``linear`` loses it."""
    if aten_op(node.target) is aten.addmm.default:
        new = at.editor.insert(aten.mm.default, node.args[1:], rule=at.rule, origin=[node],
                               after=node)  # fmt: skip
        at.editor.replace_all_uses(node, new, at.rule)
        return new
    kwargs = {k: v for k, v in node.kwargs.items() if k != "bias"}
    at.editor.set_args(node, node.args[:2], kwargs, rule=at.rule)
    return node


def _writes_first(node: fx.Node) -> bool:
    """Whether ``node`` writes into its first argument (an in-place op)."""
    schema = schema_of(node.target)
    if schema is None or not schema.arguments:
        return False
    info = schema.arguments[0].alias_info
    return info is not None and info.is_write
