"""The default pipeline: complete, in a deterministic order, and safe on real graphs."""

from __future__ import annotations

import pytest
import torch

import fxpass as fp
from fxpass.passes.default import DEFAULT_PASSES
from fxpass.verify.testing import Captured, check_pass

from _models import count, decoder, exported, exported_gm, lifted_inputs


def test_default_list_is_the_documented_order():
    assert fp.registry.pass_list("default").names()[: len(DEFAULT_PASSES)] == DEFAULT_PASSES
    assert DEFAULT_PASSES[-2:] == ["cse", "dce"]
    for name in DEFAULT_PASSES:
        assert name in fp.registry.names()
    fusions = [n for n in DEFAULT_PASSES if n.startswith("fuse_")]
    assert fusions == sorted(fusions, key=lambda n: ("quant" not in n, "add" not in n))


@pytest.mark.parametrize(
    "config",
    [{}, {"norm_style": "gemma", "qk_norm": True, "sandwich_norm": True}],
    ids=["llama", "gemma-qk-sandwich"],
)
def test_default_pipeline_shrinks_an_exported_decoder_and_keeps_its_numerics(config):
    # The model's own weights: random N(0, 1) ones grow activations ~8x per projection, and
    # the fused norm's single rounding (HF's Llama spelling rounds to bf16 before the weight)
    # then differs by more than bf16 tolerance at the logits.
    ep = exported(layers=2, **config)
    gm = ep.graph_module
    nodes = len(gm.graph.nodes)
    inputs = [*lifted_inputs(ep), *decoder(layers=2, **config).example_inputs()]
    c = Captured(gm, inputs, "export")
    check = check_pass("default", c, modified=True)
    out = check.graph_module
    assert len(out.graph.nodes) < nodes
    assert count(out, torch.ops.aten.expand.default) == 0
    ran = [r.name for r in check.report.root.children[0].children]
    assert ran == fp.registry.pass_list("default").names()


@pytest.mark.parametrize(
    ("config", "fused_add", "lone_norms"),
    [
        ({}, 4, 1),
        ({"norm_style": "plain"}, 4, 1),
        ({"norm_style": "gemma", "qk_norm": True, "sandwich_norm": True}, 4, 9),
    ],
    ids=["llama", "plain", "gemma-qk-sandwich"],
)
def test_default_pipeline_fuses_every_norm_of_an_exported_decoder(config, fused_add, lone_norms):
    """Two layers: the first input norm has no add before it; every other norm follows one."""
    assert DEFAULT_PASSES[0] == "remove_assert_ops"  # asserts hide the norms from the fusions
    gm = exported_gm(layers=2, **config)
    out = fp.Pipeline.parse("default").run(gm).graph_module
    assert count(out, torch.ops.fxpass.fused_add_rmsnorm.default) == fused_add
    assert count(out, torch.ops.fxpass.rms_norm.default) == lone_norms
    assert count(out, torch.ops.aten.rsqrt.default) == 0
    assert count(out, torch.ops.aten._assert_tensor_metadata.default) == 0
