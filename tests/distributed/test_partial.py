"""Partial sums go through the ops linear in them; a bias is added on one rank; the first
op that needs the full value gets an all-reduce."""

from __future__ import annotations

import torch

from fxpass.distributed.placement import PARTIAL
from fxpass.distributed.propagate import Flow
from fxpass.distributed.sites import Params


class _Combine(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.bias = torch.nn.Parameter(torch.zeros(4))

    def forward(self, rows, weights):
        out = (rows * weights).view(2, 2, 4).sum(1) + self.bias
        return torch.relu(out)


def test_linear_ops_keep_partial_sums_and_the_first_other_op_reduces():
    ep = torch.export.export(_Combine(), (torch.randn(4, 4), torch.randn(4, 1)))
    gm = ep.graph_module
    rows = next(n for n in gm.graph.nodes if n.name == "rows")
    flow = Flow(gm, {}, {}, 2, params=Params(gm, ep.graph_signature), partial_seeds=[rows]).run()
    ops = {n.target.__name__.split(".")[0]: n for n in gm.graph.nodes if n.op == "call_function"}
    for name in ("mul", "view", "sum", "add"):
        assert flow.layouts[ops[name]] is PARTIAL, name
    assert flow.rank0_adds == [ops["add"]]  # the bias: one rank adds it
    (reduction,) = flow.reductions
    assert reduction.value is ops["add"] and reduction.users == [ops["relu"]]
    assert ops["relu"] not in flow.layouts
