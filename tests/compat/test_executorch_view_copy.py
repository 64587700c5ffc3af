"""torch's ReplaceViewOpsWithViewCopyOpsPass on fxpass's ExportPass builds torch's graph."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("executorch.exir")

from _executorch_helpers import graph_difference
from torch._export.passes import ReplaceViewOpsWithViewCopyOpsPass as TorchPass
from torch.export import Dim

from fxpass.compat.executorch._view_copy import ReplaceViewOpsWithViewCopyOpsPass


class Views(torch.nn.Module):
    def forward(self, x, y):
        a = x.view(4, 6).t() @ y  # view, permute, matmul (an _unsafe_view inside)
        b = x.reshape(2, 12)[:, 3:]  # view, slice
        return a.relu(), b.sum(dim=1), x.unsqueeze(0).expand(2, 2, 3, 4)


class Flatten(torch.nn.Module):
    def forward(self, x):
        return x.view(x.size(0), -1) + 1.0


def _program():
    x, y = torch.randn(2, 3, 4), torch.randn(4, 5)
    return torch.export.export(Views(), (x, y)).run_decompositions({})


def _both(program):
    theirs = TorchPass()(torch.fx.GraphModule(program.graph_module, program.graph))
    ours = ReplaceViewOpsWithViewCopyOpsPass()(program.graph_module)
    return theirs, ours


def test_the_same_graph_and_metadata_as_torchs_pass():
    program = _program()
    before = [n.target for n in program.graph.nodes]
    assert program.graph_module.meta  # torch's pass drops it; so must fxpass's
    theirs, ours = _both(program)
    assert graph_difference(ours.graph_module, theirs.graph_module) is None
    replaced = [n.target for n in ours.graph_module.graph.nodes]
    assert torch.ops.aten.view_copy.default in replaced
    assert torch.ops.aten.view.default in before and torch.ops.aten.view.default not in replaced
    assert ours.modified and ours.graph_module is not program.graph_module
    assert ours.graph_module.meta == theirs.graph_module.meta == {}
    x, y = torch.randn(2, 3, 4), torch.randn(4, 5)
    for got, want in zip(ours.graph_module(x, y), program.module()(x, y)):
        torch.testing.assert_close(got, want)


def test_a_program_without_views_still_comes_back_as_torchs_does():
    program = torch.export.export(torch.nn.ReLU(), (torch.randn(3),)).run_decompositions({})
    theirs, ours = _both(program)
    assert graph_difference(ours.graph_module, theirs.graph_module) is None
    assert ours.modified and ours.graph_module is not program.graph_module
    assert ours.graph_module.meta == {}


def test_symbolic_sizes_run_torchs_own_pass():
    x = torch.randn(2, 3, 4)
    dynamic = ({0: Dim("b", min=2, max=8)},)
    program = torch.export.export(Flatten(), (x,), dynamic_shapes=dynamic).run_decompositions({})
    theirs, ours = _both(program)
    assert graph_difference(ours.graph_module, theirs.graph_module) is None
    assert torch.ops.aten.view_copy.default in [n.target for n in ours.graph_module.graph.nodes]
