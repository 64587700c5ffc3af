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
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import fx

__all__ = [
    "C10D",
    "DEFAULT_GROUP",
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


def _call(graph: fx.Graph, op: Any, *args: Any, **kwargs: Any) -> fx.Node:
    return graph.call_function(op, args, kwargs)


def all_reduce(graph: fx.Graph, value: fx.Node, group: str) -> fx.Node:
    """``wait_tensor(all_reduce(value, "sum", group))``, inserted at the graph's cursor."""
    reduced = _call(graph, C10D.all_reduce.default, value, "sum", group)
    return _call(graph, C10D.wait_tensor.default, reduced)


def _to_front(graph: fx.Graph, value: fx.Node, shape: Sequence[int], dim: int) -> fx.Node:
    """``value`` with ``dim`` first, contiguous (what the dim-0 collectives take)."""
    if all(s == 1 for s in shape[:dim]):
        rest = [s for i, s in enumerate(shape) if i != dim]
        return _call(graph, aten.view.default, _contiguous(graph, value), [shape[dim], *rest])
    order = [dim, *(i for i in range(len(shape)) if i != dim)]
    moved = _call(graph, aten.permute.default, value, order)
    return _call(graph, aten.clone.default, moved, memory_format=torch.contiguous_format)


def _from_front(graph: fx.Graph, value: fx.Node, shape: Sequence[int], dim: int) -> fx.Node:
    """Undo :func:`_to_front` for a result whose (moved) dim has size ``shape[dim]``."""
    if all(s == 1 for s in shape[:dim]):
        return _call(graph, aten.view.default, value, list(shape))
    order = [dim, *(i for i in range(len(shape)) if i != dim)]
    inverse = [order.index(i) for i in range(len(shape))]
    moved = _call(graph, aten.permute.default, value, inverse)
    return _call(graph, aten.clone.default, moved, memory_format=torch.contiguous_format)


def _contiguous(graph: fx.Graph, value: fx.Node) -> fx.Node:
    val = value.meta.get("val")
    if isinstance(val, torch.Tensor) and val.is_contiguous():
        return value
    return _call(graph, aten.clone.default, value, memory_format=torch.contiguous_format)


def all_gather(
    graph: fx.Graph, value: fx.Node, local: Sequence[int], dim: int, world_size: int, group: str
) -> fx.Node:
    """The full tensor from each rank's piece ``value`` (of shape ``local``) along ``dim``,
    in rank order."""
    local = list(local)
    if dim == 0:
        front = _contiguous(graph, value)
    else:
        front = _to_front(graph, value, local, dim)
    gathered = _call(graph, C10D.all_gather_into_tensor.default, front, world_size, group)
    gathered = _call(graph, C10D.wait_tensor.default, gathered)
    full = list(local)
    full[dim] *= world_size
    if dim == 0:
        return gathered
    return _from_front(graph, gathered, full, dim)


def reduce_scatter(
    graph: fx.Graph, value: fx.Node, full: Sequence[int], dim: int, world_size: int, group: str
) -> fx.Node:
    """This rank's piece along ``dim`` of the sum over ranks of ``value`` (of shape ``full``)."""
    full = list(full)
    front = _contiguous(graph, value) if dim == 0 else _to_front(graph, value, full, dim)
    scattered = _call(graph, C10D.reduce_scatter_tensor.default, front, "sum", world_size, group)
    scattered = _call(graph, C10D.wait_tensor.default, scattered)
    local = list(full)
    local[dim] //= world_size
    return scattered if dim == 0 else _from_front(graph, scattered, local, dim)


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


def sink_below_views(reduce: fx.Node, wait: fx.Node) -> bool:
    """Move an all-reduce (and its wait) below the reshapes that are its only users — a
    reshape of a sum is the sum of the reshapes — so it reduces the value the next op
    reads (core ATen reshapes every matmul's output back to [batch, seq, hidden])."""
    moved = False
    while len(wait.users) == 1:
        (view,) = wait.users
        if view.op != "call_function" or view.target not in _VIEWS:
            return moved
        view.replace_input_with(wait, reduce.args[0])
        reduce.update_arg(0, view)
        view.replace_all_uses_with(wait, delete_user_cb=lambda u: u is not reduce)
        view.append(reduce)
        reduce.append(wait)
        wait.meta["val"] = view.meta["val"]
        moved = True
    return moved
