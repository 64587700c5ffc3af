"""The layout check: new nodes record what their fake kernels give, their users still fit."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import fxpass as fp
from fxpass.passes.fusion._norm_patterns import norm_ok, rms_norm, scalars
from fxpass.rewrite import P, Rule, RuleSet
from fxpass.verify import LayoutError, check_layouts, require_layouts

from _models import exported

aten = torch.ops.aten
RMS = torch.ops.fxpass.rms_norm.default


class _HeadNorm(nn.Module):
    """A per-head norm on a transposed view, whose result a ``view`` reads back."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(8))

    def forward(self, x):
        b, s, h, d = x.shape
        t = x.transpose(1, 2)
        y = t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight
        return y.transpose(1, 2).view(b, s, h * d)


def _head_norm_ep() -> torch.export.ExportedProgram:
    torch.manual_seed(0)
    ep = torch.export.export(_HeadNorm(), (torch.randn(2, 5, 4, 8),))
    return ep.run_decompositions({})


def _head_norm_gm() -> torch.fx.GraphModule:
    return _head_norm_ep().graph_module


def _on_contiguous_copy(x, w, eps, offset=0.0):
    # the old bug, planted: the fused op's result is contiguous whatever x's layout
    return RMS(
        aten.clone.default(x, memory_format=torch.contiguous_format), w, *scalars(eps, offset)
    )


PLANTED = RuleSet(
    "fuse_on_contiguous_copy",
    [Rule(rms_norm(P.node("x")), _on_contiguous_copy, where=lambda **b: norm_ok(b))],
)


def _records_contiguous(gm: torch.fx.GraphModule) -> bool:
    """Fuse, then record a contiguous layout on each fused node: a lying fake kernel."""
    assert fp.Pipeline(["fuse_rmsnorm"]).run(gm).modified
    for node in gm.graph.nodes:
        if node.target is RMS:
            val = node.meta["val"]
            with val.fake_mode:
                node.meta["val"] = torch.empty_like(val, memory_format=torch.contiguous_format)
    return True


def test_real_graphs_are_clean_before_and_after_the_fusions():
    ep = exported(layers=1, qk_norm_transposed=True, dtype=torch.float32)
    gm = ep.graph_module
    assert check_layouts(gm, every_node=True) == []
    result = fp.Pipeline(["default"]).add_checks(require_layouts()).run(gm)
    assert result.modified and sum(n.target is RMS for n in gm.graph.nodes) == 3
    assert check_layouts(gm) == [] and check_layouts(gm, every_node=True) == []


def test_a_recorded_layout_the_fake_kernel_does_not_give_is_flagged():
    gm = _head_norm_gm()
    _records_contiguous(gm)
    (problem,) = [p for p in check_layouts(gm) if "rms_norm" in p.split(",")[0]]
    assert problem.startswith("%rms_norm") and "made by pass 'fuse_rmsnorm'" in problem
    assert "records shape (2, 4, 5, 8) strides (160, 40, 8, 1)" in problem
    assert "its fake kernel gives shape (2, 4, 5, 8) strides (160, 8, 32, 1)" in problem


def test_a_user_traced_against_the_old_layout_is_flagged_and_the_pass_named():
    gm = _head_norm_gm()
    before = str(gm.graph)
    pipe = fp.Pipeline([PLANTED]).add_checks(require_layouts())
    with pytest.raises(fp.core.CheckFailedError) as info:
        pipe.run(gm)
    assert "after pass 'fuse_on_contiguous_copy'" in str(info.value)
    cause = info.value.cause
    assert isinstance(cause, LayoutError)
    message = str(cause)
    assert "%transpose_1 (aten.transpose.int), a user of %rms_norm_default made by pass " in message
    assert "records shape (2, 5, 4, 8) strides (160, 32, 8, 1)" in message  # what the view needs
    assert "re-run on its inputs it gives shape (2, 5, 4, 8) strides (160, 8, 40, 1)" in message
    assert str(gm.graph) == before  # rolled back


def test_fusions_keep_users_valid_where_the_planted_pass_does_not():
    ep = _head_norm_ep()
    x = torch.randn(2, 5, 4, 8)
    expected = ep.module()(x)
    fp.Pipeline(["fuse_rmsnorm"]).add_checks(require_layouts()).run(ep.graph_module)
    assert sum(n.target is RMS for n in ep.graph_module.graph.nodes) == 1
    torch.testing.assert_close(ep.module()(x), expected)
