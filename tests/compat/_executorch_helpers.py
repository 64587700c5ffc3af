"""Small Edge programs and a graph comparison for the fxpass.compat.executorch tests."""

from __future__ import annotations

import copy
import functools
from typing import Any

import pytest
import torch

pytest.importorskip("executorch.exir")

from executorch.exir import to_edge
from torch.export import Dim

from fxpass.fxutil.values import same_value

#: The node metadata ExecuTorch's ExportPass sets and fxpass's must set identically.
META = ("val", "stack_trace", "nn_module_stack", "debug_handle", "from_node", "tensor_meta")


class AddRelu(torch.nn.Module):
    def forward(self, x, y):
        return torch.relu(x + y) + y


class WithConstant(torch.nn.Module):
    """A lifted tensor constant (not a parameter, not a buffer)."""

    def __init__(self):
        super().__init__()
        self.scale = torch.tensor([1.0, 2.0, 3.0])

    def forward(self, x):
        return x * self.scale + self.scale


class Flatten(torch.nn.Module):
    """Symbolic batch size: sym_size nodes and a view_copy with a symbolic shape."""

    def forward(self, x):
        return (x.view(x.size(0), -1) + 1.0).relu()


class Merge(torch.nn.Module):
    """Two symbolic sizes multiplied (``sym_size`` nodes and an ``operator.mul`` of them), and
    work on another input that is ready at the same time."""

    def forward(self, x, y):
        return (x.reshape(x.size(0) * x.size(1), -1) * 2.0).relu(), y.relu()


class Branches(torch.nn.Module):
    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda t: t + t, lambda t: t - 1.0, (x,))


PROGRAMS: dict[str, tuple[type, tuple, Any]] = {
    "add_relu": (AddRelu, (torch.randn(4, 8), torch.randn(4, 8)), None),
    "constant": (WithConstant, (torch.randn(2, 3),), None),
    "dynamic": (Flatten, (torch.randn(2, 3, 4),), ({0: Dim("batch", min=1, max=8)},)),
    "cond": (Branches, (torch.randn(3, 4),), None),
    "sym_mul": (
        Merge,
        (torch.randn(2, 3, 4), torch.randn(5)),
        ({0: Dim("a", min=1, max=8), 1: Dim("b", min=1, max=8)}, None),
    ),
}


@functools.cache
def _edge(name: str):
    cls, inputs, dynamic = PROGRAMS[name]
    return to_edge(torch.export.export(cls(), inputs, dynamic_shapes=dynamic))


def edge_manager(name: str):
    """A fresh copy of ``to_edge(export(...))`` of the program ``name`` (see :data:`PROGRAMS`)."""
    return copy.deepcopy(_edge(name))


def edge_program(name: str) -> torch.export.ExportedProgram:
    """A fresh copy of the Edge program ``name``."""
    return edge_manager(name).exported_program()


def inputs(name: str) -> tuple:
    return PROGRAMS[name][1]


def _history(sources: Any) -> Any:
    """``from_node`` without graph ids (they differ between copies of one graph)."""
    if not isinstance(sources, list):
        return sources
    return [
        (s.name, s.target, s.pass_name, [str(a) for a in s.action], _history(s.from_node))
        for s in sources
    ]


def graph_difference(a: torch.fx.GraphModule, b: torch.fx.GraphModule) -> str | None:
    """None when ``a`` and ``b`` have the same nodes (op, name, target, arguments) in the same
    order with the same :data:`META`; else the first difference."""
    na, nb = list(a.graph.nodes), list(b.graph.nodes)
    if len(na) != len(nb):
        return f"{len(na)} nodes against {len(nb)}:\n{a.graph}\n{b.graph}"
    for x, y in zip(na, nb):
        if (x.op, x.name, x.target, str(x.args), str(x.kwargs)) != (
            y.op,
            y.name,
            y.target,
            str(y.args),
            str(y.kwargs),
        ):
            return f"{x.format_node()} against {y.format_node()}"
        for key in META:
            u, v = x.meta.get(key), y.meta.get(key)
            if key == "from_node":
                u, v = _history(u), _history(v)
            same = same_value(u, v) if key == "val" else u == v
            if not same:
                return f"meta[{key!r}] of {x.name}: {u!r} against {v!r}"
    return None


def run(ep: torch.export.ExportedProgram, gm: torch.fx.GraphModule, *args: Any) -> Any:
    """Run an Edge graph module of ``ep``'s signature on ``args``."""
    from torch.export.graph_signature import InputKind

    user = iter(args)
    flat = []
    for spec in ep.graph_signature.input_specs:
        if spec.kind == InputKind.USER_INPUT:
            flat.append(next(user))
        elif spec.target in ep.state_dict:
            flat.append(ep.state_dict[spec.target])
        else:
            flat.append(ep.constants[spec.target])
    with torch.no_grad():
        return gm(*flat)
