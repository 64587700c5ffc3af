"""Small real graphs for the rewrite engine's tests (exported, traced, compiled)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

aten = torch.ops.aten


class Arith(nn.Module):
    """Algebra the identity rules simplify: x*1, x+0, neg(neg(x)), a shared subexpression."""

    def forward(self, x, y):
        a = (x * 1) + 0
        b = torch.neg(torch.neg(y))
        c = torch.relu(a + b)
        return c * 2, c + a


def exported_arith():
    args = (torch.randn(4, 8), torch.randn(4, 8))
    ep = torch.export.export(Arith(), args).run_decompositions()
    return ep, args


def run(ep, args):
    return ep.module()(*args)


def count(gm, target):
    return sum(1 for n in gm.graph.nodes if n.op == "call_function" and n.target is target)


def traced(fn):
    return torch.fx.symbolic_trace(fn)


def edge():
    """tests/_edge.py (ExecuTorch Edge programs of the shared models); skips where ExecuTorch
    is not installed."""
    return pytest.importorskip("_edge")
