"""control_flow_subgraphs: the branches and bodies a graph's control flow runs, nested ones
included, each once, found without recursion."""

from __future__ import annotations

import operator
import sys

import torch
from torch import fx
from torch._higher_order_ops.map import map as torch_map

from fxpass.fxutil.subgraphs import CONTROL_FLOW_OPS, control_flow_subgraphs


class Cond(torch.nn.Module):
    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda x: x.sin(), lambda x: x.cos(), (x,))


class Map(torch.nn.Module):
    def forward(self, xs):
        return torch_map(lambda x: x * 2.0, xs)


def test_cond_branches_and_map_body_of_exported_programs():
    ep = torch.export.export(Cond(), (torch.randn(3),))
    found = dict(control_flow_subgraphs(ep.graph_module))
    assert sorted(found) == ["false_graph_0", "true_graph_0"]
    assert found["true_graph_0"] is ep.graph_module.true_graph_0
    ep = torch.export.export(Map(), (torch.randn(4, 3),))
    ((name, body),) = control_flow_subgraphs(ep.graph_module)
    assert isinstance(body, fx.GraphModule) and name.startswith("body_graph")


def _nest(depth: int) -> fx.GraphModule:
    leaf = fx.symbolic_trace(lambda x: (x + 1,))
    other = fx.symbolic_trace(lambda x: (x - 1,))
    gm = leaf
    for _ in range(depth):
        g = fx.Graph()
        x = g.placeholder("x")
        root = torch.nn.Module()
        root.t, root.f = gm, other
        cond = g.call_function(
            torch.ops.higher_order.cond, (x, g.get_attr("t"), g.get_attr("f"), (x,))
        )
        g.output(g.call_function(operator.getitem, (cond, 0)))
        gm = fx.GraphModule(root, g)
    return gm


def _frames() -> int:
    frame, n = sys._getframe(), 0
    while frame is not None:
        frame, n = frame.f_back, n + 1
    return n


def test_nested_conds_outer_first_each_once_without_recursion():
    depth = 60  # building a level costs more each time (torch's GraphModule): kept small
    gm = _nest(depth)
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(_frames() + depth // 2)  # too few frames for a recursive walk
    try:
        found = list(control_flow_subgraphs(gm))
    finally:
        sys.setrecursionlimit(limit)
    assert len(found) == depth + 1  # each level's true branch, and the one shared false branch
    assert [name for name, _ in found[:3]] == ["t", "f", "t.t"]
    assert found[-1][0] == ".".join(["t"] * depth)


def test_only_modules_a_control_flow_op_runs():
    g = fx.Graph()
    x = g.placeholder("x")
    root = torch.nn.Module()
    root.sub = fx.symbolic_trace(lambda x: x + 1)
    g.output(g.call_module("sub", (x,)))  # called as a module, not through control flow
    gm = fx.GraphModule(root, g)
    assert list(control_flow_subgraphs(gm)) == []
    assert torch.ops.higher_order.cond.name() in CONTROL_FLOW_OPS
