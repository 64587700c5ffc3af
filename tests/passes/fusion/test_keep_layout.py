"""Fusions keep the layouts downstream nodes were traced against (fusion/_keep_layout.py).

The fused ops lay their results out as the unfused ATen chain does, so a per-head norm on a
transposed view, read back through ``transpose(...).view(...)``, stays valid in every IR,
eager and compiled (tests/models/test_llama.py compiles a decoder built so); where the op's layout would differ from the replaced node's, the
replacement restores it with a copy, or declines.
"""

from __future__ import annotations

import functools

import pytest
import torch
from _fusion_helpers import NORMS, Captured, assert_close, count
from torch import nn

import fxpass as fp
from fxpass.passes.fusion._keep_layout import fake_result, keep_layout
from fxpass.rewrite import P, Rule, RuleSet
from fxpass.verify import check_layouts

F = torch.ops.fxpass
aten = torch.ops.aten


class HeadNorms(nn.Module):
    """q/k-style norms over head_dim on views whose layout is not contiguous.

    ``transposed``: the (b, heads, s, d) transpose of a projection, read back with
    ``transpose(1, 2).view(b, s, -1)`` — valid only if the norm keeps the transposed layout.
    ``sliced``: one slice of a fused qkv projection (not dense), read back the same way.
    """

    def __init__(self, layout: str, norm: str = "llama", hidden=32, heads=4):
        super().__init__()
        self.layout, self.heads = layout, heads
        self.proj = nn.Linear(hidden, 3 * hidden, bias=False)
        self.norm = NORMS[norm](hidden // heads)

    def forward(self, x):
        b, s, d = x.shape
        qkv = self.proj(x).view(b, s, 3, self.heads, d // self.heads)
        if self.layout == "transposed":
            h = qkv[:, :, 0].contiguous().transpose(1, 2)
        else:
            h = qkv.permute(2, 0, 3, 1, 4)[0]
        return self.norm(h).transpose(1, 2).view(b, s, d) * 2


def _factory(layout, norm):
    return functools.partial(HeadNorms, layout, norm)


@pytest.mark.parametrize(
    "layout, norm, ir, dtype",
    [
        ("transposed", "llama", "export", torch.float32),  # ATen's fused kernel on CPU
        ("transposed", "gemma", "export", torch.bfloat16),  # (1 + w): the reference kernel
        ("transposed", "gemma", "aot", torch.float32),
        ("sliced", "plain", "dynamo", torch.float32),
        ("sliced", "llama", "export", torch.bfloat16),  # the upcast copies a sliced input
    ],
)
def test_views_downstream_of_a_fused_norm_stay_valid(layout, norm, ir, dtype):
    cap = Captured(_factory(layout, norm), ir, dtype)
    expected = cap.run()
    clones = count(cap.gm, aten.clone.default)
    assert fp.Pipeline(["fuse_rmsnorm"]).run(cap.gm).modified
    assert count(cap.gm, F.rms_norm.default) == 1
    assert count(cap.gm, aten.clone.default) == clones  # the op's layout is the chain's
    assert check_layouts(cap.gm) == []
    assert_close(cap.run(), expected, dtype)


@pytest.mark.parametrize("layout, norm", [("transposed", "llama"), ("sliced", "gemma")])
def test_unlowered_export_programs_run(layout, norm):
    """``ep.run_decompositions({})`` keeps ``aten.view``: it must still fit after fusing."""
    torch.manual_seed(0)
    model = HeadNorms(layout, norm).eval()
    x = torch.randn(2, 5, 32)
    ep = torch.export.export(model, (x,)).run_decompositions({})
    result = fp.apply(ep, "remove_assert_ops,fuse_rmsnorm")
    assert count(result.graph_module, F.rms_norm.default) == 1
    torch.testing.assert_close(result.program.module()(x), model(x), rtol=1e-5, atol=1e-5)


def test_symbolic_shapes_fuse_without_guards():
    torch.manual_seed(0)
    model = HeadNorms("transposed", "gemma").eval()
    dims = ({0: torch.export.Dim("b"), 1: torch.export.Dim("s")},)
    ep = torch.export.export(model, (torch.randn(2, 5, 32),), dynamic_shapes=dims)
    result = fp.apply(ep.run_decompositions({}), "remove_assert_ops,fuse_rmsnorm")
    assert count(result.graph_module, F.rms_norm.default) == 1
    assert check_layouts(result.graph_module) == []
    x = torch.randn(3, 7, 32)  # another batch and sequence length
    torch.testing.assert_close(result.program.module()(x), model(x), rtol=1e-5, atol=1e-5)


# ----- the helper itself: restore a dense layout, decline anything else ------------------------
def _graph_with(old_strides):
    """``neg(x)`` on a transposed x, its value recorded with ``old_strides`` (as if the op
    that made it laid it out so), feeding the output."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode()
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    x.meta["val"] = mode.from_tensor(torch.empty(2, 8, 4).transpose(1, 2))
    old = graph.call_function(aten.neg.default, (x,))
    with mode:
        old.meta["val"] = torch.empty_strided((2, 4, 8), old_strides)
    graph.output(old)
    return torch.fx.GraphModule(torch.nn.Module(), graph), old


def _as_abs(x, old):
    new = aten.abs.default(x)  # laid out like x: (32, 1, 4)
    return keep_layout(new, fake_result(aten.abs.default, x), old)


_RULES = RuleSet("neg_to_abs", [Rule(P(aten.neg.default, P.node("x")).named("old"), _as_abs)])


def test_a_different_dense_layout_is_restored_with_a_copy():
    gm, _ = _graph_with((32, 8, 1))  # contiguous, where abs(x) would be x's layout
    assert _RULES(gm).modified
    out = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    assert out.target is aten.permute.default
    assert out.meta["val"].stride() == (32, 8, 1)
    assert [n.target for n in gm.graph.nodes if n.op == "call_function"] == [
        aten.abs.default,
        aten.permute.default,
        aten.clone.default,
        aten.permute.default,
    ]
    assert check_layouts(gm) == []
    x = torch.randn(2, 8, 4).transpose(1, 2)
    got = gm(x)
    assert torch.equal(got, x.abs()) and got.stride() == (32, 8, 1)


def test_the_same_layout_is_replaced_as_is_and_a_non_dense_one_declined():
    gm, _ = _graph_with((32, 1, 4))
    assert _RULES(gm).modified
    assert [n.target for n in gm.graph.nodes if n.op == "call_function"] == [aten.abs.default]
    gm, _ = _graph_with((64, 1, 8))  # gaps between rows: not dense, no copy can make it
    before = str(gm.graph)
    assert not _RULES(gm).modified and str(gm.graph) == before


def test_the_layout_check_runs_the_fused_kernel_once_per_input_layout_not_per_site(monkeypatch):
    """Weights require grad, so the fused op's fake result on them does too; its layout is
    still remembered, and every site of the same shapes is answered without a dispatch
    (with the rule's recordings off: those skip the replacement altogether, see
    tests/rewrite/test_replay.py)."""
    from fxpass.fxutil.values import FAKE_RESULTS
    from fxpass.passes.fusion.fuse_add_rmsnorm import RULES

    from _models import exported_gm

    monkeypatch.setattr(RULES.rules[0], "recordings", None)

    gm = exported_gm(remove_asserts=True)
    assert any(n.meta["val"].requires_grad for n in gm.graph.find_nodes(op="placeholder"))
    fp.apply(gm, "fuse_add_rmsnorm")  # every input layout seen once
    gm = exported_gm(remove_asserts=True)
    hits = FAKE_RESULTS.hits
    result = fp.apply(gm, "fuse_add_rmsnorm")
    sites = count(result.graph_module, F.fused_add_rmsnorm.default)
    assert sites >= 2
    assert FAKE_RESULTS.hits - hits >= 2 * sites  # the layout check and the new value, each site
