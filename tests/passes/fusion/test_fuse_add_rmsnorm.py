"""fuse_add_rmsnorm: the residual add fused only where it feeds a norm; its sum kept."""

from __future__ import annotations

import functools
import operator

import pytest
import torch
from _fusion_helpers import (
    NORMS,
    Block,
    Captured,
    assert_close,
    compiled_matches_eager,
    count,
    inputs,
    new_nodes,
)
from torch import nn

import fxpass as fp
from fxpass.passes.fusion.fuse_add_rmsnorm import fuse_add_rmsnorm
from fxpass.passes.fusion.fuse_rmsnorm import fuse_rmsnorm

from _models import decoder, exported

F = torch.ops.fxpass
FUSED = F.fused_add_rmsnorm.default
aten = torch.ops.aten


def _block(norm):
    return functools.partial(Block, NORMS[norm])


_BLOCKS = {name: _block(name) for name in ("llama", "gemma", "plain", "sqrt")}


@pytest.mark.parametrize("family", sorted(_BLOCKS))
@pytest.mark.parametrize("ir", ["export", "aot", "dynamo"])
def test_adds_feeding_norms_fused_in_every_ir(family, ir):
    cap = Captured(_BLOCKS[family], ir)
    expected = cap.run()
    assert fp.Pipeline(["fuse_add_rmsnorm"]).run(cap.gm).modified
    assert count(cap.gm, FUSED) == 2  # norm2(x + attn) and final(x + mlp); norm1 has no add
    assert_close(cap.run(), expected, torch.bfloat16)
    cap.gm.graph.lint()


@pytest.mark.parametrize(
    "config",
    [
        {},
        {"norm_style": "gemma", "sandwich_norm": True},
        {"dtype": torch.float16},
        {"dtype": torch.float32},
    ],
)
def test_decoder_residual_stream(config):
    ep = exported(**config)
    (ids,) = decoder(**config).example_inputs()
    expected = ep.module()(ids)
    fp.Pipeline(["fuse_add_rmsnorm", "fuse_rmsnorm"]).run(ep.graph_module)
    gm = ep.graph_module
    assert count(gm, FUSED) == 4  # two per layer
    rest = 1 + (4 if config.get("sandwich_norm") else 0)  # the first norm, sandwich norms
    assert count(gm, F.rms_norm.default) == rest
    assert count(gm, aten.add.Tensor) < count(exported(**config).graph_module, aten.add.Tensor)
    dtype = config.get("dtype", torch.bfloat16)
    assert_close(ep.module()(ids), expected, dtype)


def test_the_sum_stays_available_to_its_other_users():
    ep = exported()
    fuse_add_rmsnorm(ep.graph_module)
    fused = [n for n in ep.graph_module.graph.nodes if n.target is FUSED]
    chained = 0
    for node in fused:
        index = {u.args[1]: u for u in node.users}
        assert 0 in index and 1 in index  # the normalized value and the sum
        # each sum flows on as the residual of the next fused add (the residual stream)
        chained += any(u.target is FUSED for u in index[1].users)
    assert chained == len(fused) - 1 == 3


def test_after_fuse_rmsnorm_too():
    ep = exported()
    (ids,) = decoder().example_inputs()
    expected = ep.module()(ids)
    fuse_rmsnorm(ep.graph_module)
    assert fuse_add_rmsnorm(ep.graph_module)
    assert count(ep.graph_module, FUSED) == 4 and count(ep.graph_module, F.rms_norm.default) == 1
    assert_close(ep.module()(ids), expected, torch.bfloat16)


def test_new_nodes_carry_values_and_provenance():
    ep = exported()
    fuse_add_rmsnorm(ep.graph_module)
    made = new_nodes(ep.graph_module)
    assert len(made) == 12  # the op and its two results, four times
    for n in made:
        assert "val" in n.meta and n.meta["stack_trace"] and n.meta["nn_module_stack"]
        assert n.meta["fxpass_provenance"]["pass"] == "fuse_add_rmsnorm"
    fused = [n for n in made if n.target is FUSED]
    assert all(isinstance(n.meta["val"], tuple) and len(n.meta["val"]) == 2 for n in fused)
    sums = [n for n in made if n.target is operator.getitem and n.args[1] == 1]
    assert all(src.name.startswith("add") for n in sums for src in [n.meta["from_node"][0]])


class _BroadcastAdd(nn.Module):
    """A bias add (broadcast) feeding a norm, and an add whose sum no norm reads."""

    def __init__(self):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(32))
        self.norm = NORMS["llama"](32)

    def forward(self, x, h):
        return self.norm(x + self.bias), x + h


def test_broadcast_add_and_unnormed_add_left_alone():
    model = _BroadcastAdd().to(torch.bfloat16).eval()
    args = (
        torch.randn(2, 5, 32, dtype=torch.bfloat16),
        torch.randn(2, 5, 32, dtype=torch.bfloat16),
    )
    ep = torch.export.export(model, args).run_decompositions()
    assert not fuse_add_rmsnorm(ep.graph_module)
    assert fuse_rmsnorm(ep.graph_module)  # the norm itself still fuses


class _TwoNorms(nn.Module):
    """One sum feeding two norms: only one add can be fused; the other norm reads the sum."""

    def __init__(self):
        super().__init__()
        self.a = NORMS["llama"](32)
        self.b = NORMS["gemma"](32)

    def forward(self, x, h):
        s = x + h
        return self.a(s) * self.b(s)


def test_sum_feeding_two_norms():
    model = _TwoNorms().to(torch.bfloat16).eval()
    args = (
        torch.randn(2, 5, 32, dtype=torch.bfloat16),
        torch.randn(2, 5, 32, dtype=torch.bfloat16),
    )
    ep = torch.export.export(model, args).run_decompositions()
    expected = ep.module()(*args)
    fp.Pipeline(["fuse_add_rmsnorm", "fuse_rmsnorm"]).run(ep.graph_module)
    assert count(ep.graph_module, FUSED) == 1 and count(ep.graph_module, F.rms_norm.default) == 1
    assert_close(ep.module()(*args), expected, torch.bfloat16)


def test_same_outputs_under_torch_compile():
    """Inside Inductor (its post-grad ATen graph), Gemma's (1 + w) norms."""
    torch.manual_seed(0)
    model = _BLOCKS["gemma"]().eval()
    stats = compiled_matches_eager(model, inputs(torch.float32), "fuse_add_rmsnorm")
    assert stats["fuse_add_rmsnorm.rewrites"] == 2
