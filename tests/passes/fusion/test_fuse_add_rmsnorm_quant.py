"""fuse_add_rmsnorm_quant on a W8A8-style quantized model: add + norm + int8 quantization in
one op, through export, AOT and Dynamo; before or after fuse_add_rmsnorm; look-alikes kept."""

from __future__ import annotations

import functools

import pytest
import torch
from _fusion_helpers import (
    NORMS,
    Captured,
    QuantBlock,
    compiled_matches_eager,
    count,
    inputs,
    new_nodes,
)

import fxpass as fp
from fxpass.passes.fusion.fuse_add_rmsnorm_quant import fuse_add_rmsnorm_quant

F = torch.ops.fxpass
QUANT = F.fused_add_rmsnorm_quant.default


def _factory(**kwargs):
    f = functools.partial(QuantBlock, **kwargs)
    f.inputs = functools.partial(inputs, n=2)
    return f


_LLAMA = _factory()
_GEMMA = _factory(norm=NORMS["gemma"])
_SYMMETRIC = _factory(clamp_min=-127)  # a look-alike: not the contract's quantization


def _check(cap, expected):
    out = cap.run()
    # int8 codes may differ by one where the fused norm rounds once instead of twice
    torch.testing.assert_close(out.float(), expected.float(), rtol=0.05, atol=0.05)


@pytest.mark.parametrize("ir", ["export", "aot", "dynamo"])
@pytest.mark.parametrize("factory", [_LLAMA, _GEMMA], ids=["llama", "gemma"])
def test_fused_in_every_ir(ir, factory):
    cap = Captured(factory, ir)
    expected = cap.run()
    result = fp.Pipeline(["fuse_add_rmsnorm_quant"]).run(cap.gm)
    assert result.modified
    assert count(cap.gm, QUANT) == 1
    assert result.report.stats()["fuse_add_rmsnorm_quant.add_rms_norm_quant.rewritten"] == 1
    assert count(cap.gm, torch.ops.aten.round.default) == 0
    _check(cap, expected)
    cap.gm.graph.lint()


def test_after_fuse_add_rmsnorm_and_fuse_rmsnorm():
    for spec in ("fuse_add_rmsnorm,fuse_add_rmsnorm_quant", "fuse_rmsnorm,fuse_add_rmsnorm_quant"):
        cap = Captured(_LLAMA, "export")
        expected = cap.run()
        fp.Pipeline.parse(spec).run(cap.gm)
        assert count(cap.gm, QUANT) == 1
        assert count(cap.gm, F.fused_add_rmsnorm.default) == 0
        assert count(cap.gm, F.rms_norm.default) == 0
        _check(cap, expected)


def test_quantized_codes_equal_the_fused_kernel():
    cap = Captured(_LLAMA, "export")
    fuse_add_rmsnorm_quant(cap.gm)
    node = next(n for n in cap.gm.graph.nodes if n.target is QUANT)
    assert node.args[4] == 1e-6 and node.args[5] == 0.0
    assert node.meta["val"][0].dtype == torch.int8
    made = new_nodes(cap.gm)
    assert made and all("val" in n.meta and n.meta["stack_trace"] for n in made)


def test_lookalike_quantization_left_alone():
    cap = Captured(_SYMMETRIC, "export")
    assert not fuse_add_rmsnorm_quant(cap.gm)
    assert count(cap.gm, QUANT) == 0


class _NormUsedTwice(QuantBlock):
    """The normalized value is also used unquantized: fusing would lose it."""

    def forward(self, x, h):
        s = x + h
        n = self.norm(s)
        return s + n + self.quant(n).to(s.dtype)


def test_norm_with_another_reader_left_alone():
    model = _NormUsedTwice().to(torch.bfloat16).eval()
    args = inputs(n=2)
    ep = torch.export.export(model, args).run_decompositions()
    assert not fuse_add_rmsnorm_quant(ep.graph_module)
    assert fp.Pipeline(["fuse_add_rmsnorm"]).run(ep.graph_module).modified  # still a norm


def test_same_outputs_under_torch_compile():
    """On AOTAutograd's graph, run eagerly. (Inside Inductor the pass finds nothing yet:
    Inductor's decompositions spell the clamp as clamp_min + clamp_max.)"""
    torch.manual_seed(0)
    model = _LLAMA().eval()
    stats = compiled_matches_eager(
        model, inputs(torch.float32, n=2), "fuse_add_rmsnorm_quant", tol=0.05, compiler="eager"
    )
    assert stats["fuse_add_rmsnorm_quant.rewrites"] == 1
