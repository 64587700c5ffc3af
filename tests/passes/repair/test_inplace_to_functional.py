"""inplace_to_functional: relu_ -> relu where semantics allow; writes others can see stay."""

from __future__ import annotations

import torch

import fxpass as fp
from fxpass.verify import keeps_metadata
from fxpass.verify.compare import compare_outputs
from fxpass.verify.numerics import run_graph
from fxpass.verify.testing import capture


def _names(gm) -> list[str]:
    return [str(n.target) if n.op == "call_method" else getattr(n.target, "__name__", "")
            for n in gm.graph.nodes]  # fmt: skip


class _Mixed(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x, b):
        t = self.lin(x)
        t.relu_()  # the graph's own memory, no views: becomes relu
        u = torch.nn.functional.silu(t * 2, inplace=True)  # also
        v = x * 3
        view = v.view(-1)
        v.add_(1)  # a view taken before the write sees it: stays
        w = x * 1
        w.add_(b.double())  # add would promote to float64: stays
        b.mul_(2)  # the caller's tensor: stays
        return t + u, view, w


def test_dynamo_graph_rewrites_only_what_nobody_can_tell():
    c = capture(_Mixed(), (torch.randn(2, 4), torch.randn(2, 4)), "dynamo")
    expected = run_graph(c.graph_module, [t.clone() for t in c.inputs])
    pipe = fp.Pipeline.parse("inplace_to_functional").add_checks(keeps_metadata())
    result = pipe.run(c.graph_module)
    names = _names(c.graph_module)
    assert "relu_" not in names and "relu" in names
    assert names.count("add_") == 2 and names.count("mul_") == 1
    assert result.report.root.children[0].stats == {"rewritten": 2, "kept": 3}
    silu = next(n for n in c.graph_module.graph.nodes if "silu" in str(n.target))
    assert silu.kwargs.get("inplace") is False
    got = run_graph(c.graph_module, [t.clone() for t in c.inputs])
    assert compare_outputs(expected, got).ok


def test_aten_in_place_ops_find_their_functional_twin_by_name():
    aten = torch.ops.aten

    def f(x):
        y = x * 2
        aten.relu_.default(y)
        aten.add_.Tensor(y, x)
        return (y,)

    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(f, tracing_mode="fake", pre_dispatch=True)(torch.randn(4))
    targets = [n.target for n in gm.graph.nodes]
    assert aten.relu_.default in targets and aten.add_.Tensor in targets
    x = torch.randn(4)
    expected = gm(x)
    fp.Pipeline.parse("inplace_to_functional").run(gm)
    targets = [n.target for n in gm.graph.nodes]
    assert aten.relu.default in targets and aten.add.Tensor in targets
    assert aten.relu_.default not in targets and aten.add_.Tensor not in targets
    assert torch.equal(gm(x)[0], expected[0])
