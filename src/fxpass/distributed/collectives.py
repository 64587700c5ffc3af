"""Insert torch's functional collectives into a graph.

The nodes call ``torch.ops._c10d_functional`` — the ops behind
``torch.distributed._functional_collectives.all_reduce``, ``all_gather_tensor`` and
``reduce_scatter_tensor`` — each followed by its ``wait_tensor``, so a sharded graph runs
eagerly on any process group, compiles with Inductor (which schedules the waits), and
survives ``torch.export`` save and load. A collective names its process group by string,
as those ops do: ``"0"`` is the default group ``torch.distributed.init_process_group``
creates.

All-gather and reduce-scatter work along dim 0; for another dim the helpers move it to
the front first (a view when the dims before it have size 1, a copy otherwise).

Every node goes in through :class:`Inserter`, which edits through :class:`fxpass.edit.Editor`:
the debug counter, the report's change list and provenance (``from_node``: the node a
collective serves) see each one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import fx

from ..edit.editor import Editor

__all__ = [
    "C10D",
    "DEFAULT_GROUP",
    "Inserter",
    "all_gather",
    "all_reduce",
    "is_collective",
    "reduce_scatter",
    "sink_below_views",
    "sum_all_reduces",
]

aten = torch.ops.aten
C10D = torch.ops._c10d_functional
DEFAULT_GROUP = "0"

_VIEWS = {aten.view.default, aten.reshape.default, aten._unsafe_view.default}
_COLLECTIVES = {
    C10D.all_reduce.default,
    C10D.all_gather_into_tensor.default,
    C10D.reduce_scatter_tensor.default,
    C10D.wait_tensor.default,
}


def is_collective(target: Any) -> bool:
    return target in _COLLECTIVES


class Inserter:
    """Insert nodes one after another right after ``after`` (or right before ``before``),
    through ``editor``, each standing for ``origin`` (its provenance) under ``rule``.

    >>> put = Inserter(editor, "tensor_parallel", [matmul], after=matmul)  # doctest: +SKIP
    >>> reduced = all_reduce(put, matmul, "0")                            # doctest: +SKIP
    """

    def __init__(
        self,
        editor: Editor,
        rule: str,
        origin: Sequence[fx.Node],
        *,
        after: fx.Node | None = None,
        before: fx.Node | None = None,
    ) -> None:
        if (after is None) == (before is None):
            raise ValueError("Inserter: give exactly one of after= or before=")
        self.editor, self.rule, self.origin = editor, rule, list(origin)
        self.after, self.before = after, before
        self.created: list[fx.Node] = []

    def __call__(self, op: Any, *args: Any, **kwargs: Any) -> fx.Node:
        node = self.editor.insert(
            op, args, kwargs, rule=self.rule, origin=self.origin,
            after=self.after, before=self.before,
        )  # fmt: skip
        if self.after is not None:
            self.after = node
        self.created.append(node)
        return node


def all_reduce(put: Inserter, value: fx.Node, group: str, op: str = "sum") -> fx.Node:
    """``wait_tensor(all_reduce(value, op, group))``."""
    reduced = put(C10D.all_reduce.default, value, op, group)
    return put(C10D.wait_tensor.default, reduced)


def _to_front(put: Inserter, value: fx.Node, shape: Sequence[int], dim: int) -> fx.Node:
    """``value`` with ``dim`` first, contiguous (what the dim-0 collectives take)."""
    if all(s == 1 for s in shape[:dim]):
        rest = [s for i, s in enumerate(shape) if i != dim]
        return put(aten.view.default, _contiguous(put, value), [shape[dim], *rest])
    order = [dim, *(i for i in range(len(shape)) if i != dim)]
    moved = put(aten.permute.default, value, order)
    return put(aten.clone.default, moved, memory_format=torch.contiguous_format)


def _from_front(put: Inserter, value: fx.Node, shape: Sequence[int], dim: int) -> fx.Node:
    """Undo :func:`_to_front` for a result whose (moved) dim has size ``shape[dim]``."""
    if all(s == 1 for s in shape[:dim]):
        return put(aten.view.default, value, list(shape))
    order = [dim, *(i for i in range(len(shape)) if i != dim)]
    inverse = [order.index(i) for i in range(len(shape))]
    moved = put(aten.permute.default, value, inverse)
    return put(aten.clone.default, moved, memory_format=torch.contiguous_format)


def _contiguous(put: Inserter, value: fx.Node) -> fx.Node:
    val = value.meta.get("val")
    if isinstance(val, torch.Tensor) and val.is_contiguous():
        return value
    return put(aten.clone.default, value, memory_format=torch.contiguous_format)


def all_gather(
    put: Inserter, value: fx.Node, local: Sequence[int], dim: int, world_size: int, group: str
) -> fx.Node:
    """The full tensor from each rank's piece ``value`` (of shape ``local``) along ``dim``,
    in rank order."""
    local = list(local)
    front = _contiguous(put, value) if dim == 0 else _to_front(put, value, local, dim)
    gathered = put(C10D.all_gather_into_tensor.default, front, world_size, group)
    gathered = put(C10D.wait_tensor.default, gathered)
    full = list(local)
    full[dim] *= world_size
    if dim == 0:
        return gathered
    return _from_front(put, gathered, full, dim)


def reduce_scatter(
    put: Inserter, value: fx.Node, full: Sequence[int], dim: int, world_size: int, group: str
) -> fx.Node:
    """This rank's piece along ``dim`` of the sum over ranks of ``value`` (of shape ``full``)."""
    full = list(full)
    front = _contiguous(put, value) if dim == 0 else _to_front(put, value, full, dim)
    scattered = put(C10D.reduce_scatter_tensor.default, front, "sum", world_size, group)
    scattered = put(C10D.wait_tensor.default, scattered)
    local = list(full)
    local[dim] //= world_size
    return scattered if dim == 0 else _from_front(put, scattered, local, dim)


def sum_all_reduces(gm: fx.GraphModule) -> list[tuple[fx.Node, fx.Node]]:
    """Every ``wait_tensor(all_reduce(x, "sum", group))`` of ``gm``: (all_reduce, wait)."""
    out = []
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is C10D.wait_tensor.default:
            src = node.args[0]
            if (
                isinstance(src, fx.Node)
                and src.target is C10D.all_reduce.default
                and src.args[1] == "sum"
                and len(src.users) == 1
            ):
                out.append((src, node))
    return out


def sink_below_views(reduce: fx.Node, wait: fx.Node, editor: Editor) -> bool:
    """Move an all-reduce (and its wait) below the reshapes that are its only users — a
    reshape of a sum is the sum of the reshapes — so it reduces the value the next op
    reads (core ATen reshapes every matmul's output back to [batch, seq, hidden])."""
    moved = False
    rule = "sink_all_reduce_below_views"
    while len(wait.users) == 1:
        (view,) = wait.users
        if view.op != "call_function" or view.target not in _VIEWS:
            return moved
        if not editor.allow():
            return moved
        editor.replace_input(view, wait, reduce.args[0], rule=rule)
        editor.set_args(reduce, (view, *reduce.args[1:]), rule=rule)
        for user in [u for u in view.users if u is not reduce]:
            editor.replace_input(user, view, wait, rule=rule)
        editor.move(reduce, after=view, rule=rule)
        editor.move(wait, after=reduce, rule=rule)
        wait.meta["val"] = view.meta["val"]
        moved = True
    return moved
