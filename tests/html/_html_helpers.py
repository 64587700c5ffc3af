"""Graphs for the report tests: the tiny decoder, and a synthetic 16k-node graph."""

from __future__ import annotations

import copy
import functools

import torch
from torch import fx

aten = torch.ops.aten


@functools.cache
def _tiny() -> torch.fx.GraphModule:
    import _models

    return _models.exported_gm()


def tiny_gm() -> torch.fx.GraphModule:
    """The exported 2-layer tiny decoder's graph module (asserts kept), a fresh copy."""
    return copy.deepcopy(_tiny())


def big_graph(blocks: int = 4000) -> fx.GraphModule:
    """A chain of ``blocks`` add-mul-relu-add blocks: 4 nodes each (16k nodes at 4000)."""
    g = fx.Graph()
    x = g.placeholder("x")
    x.meta["val"] = torch.empty(4, 8)
    h = x
    for _ in range(blocks):
        a = g.call_function(aten.add.Tensor, (h, 1.0))
        b = g.call_function(aten.mul.Tensor, (a, 2.0))
        c = g.call_function(aten.relu.default, (b,))
        h = g.call_function(aten.add.Tensor, (c, x))
    g.output((h,))
    return fx.GraphModule(torch.nn.Module(), g)


def fuse_mul_relu(every: int):
    """A pass replacing mul(a, 2) -> relu by one node, in every ``every``-th block."""

    def fuse_mul_relu(gm: fx.GraphModule) -> bool:
        muls = [n for n in gm.graph.nodes if n.target is aten.mul.Tensor][::every]
        for mul in muls:
            relu = next(iter(mul.users))
            with gm.graph.inserting_before(relu):
                fused = gm.graph.call_function(torch.nn.functional.leaky_relu, (mul.args[0],))
            fused.meta["fxpass_provenance"] = {
                "rule": "mul_relu",
                "pass": "fuse_mul_relu",
                "replaced": [mul.name, relu.name],
                "location": "test:1",
            }
            relu.replace_all_uses_with(fused)
            gm.graph.erase_node(relu)
            gm.graph.erase_node(mul)
        return bool(muls)

    return fuse_mul_relu
