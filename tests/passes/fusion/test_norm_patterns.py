"""_norm_patterns: the library fusions find the same sites whatever ran before them.

Each fusion runs alone and after the canonicalization passes on every graph a user may hand
it — torch.export as saved (float32 graphs keep no-op ``.to(torch.float32)`` casts that the
next residual add reads), core ATen, AOT and Dynamo — of the embedded decoder and a Hugging
Face Llama; and on blocks that put views between the residual add and the norm, or spell
RMSNorm as T5 does. Same count of fused sites both ways, outputs equal eager.
"""

from __future__ import annotations

import functools

import pytest
import torch
from _captures import captured
from _fusion_helpers import Block, Captured, LlamaRMSNorm, QuantBlock, assert_close, count, inputs
from torch import nn

import fxpass as fp

F = torch.ops.fxpass
CANONICALIZE = ["remove_assert_ops", "remove_detach", "remove_noop", "erase_copy"]
SITES = {
    "fuse_add_rmsnorm": (F.fused_add_rmsnorm.default, 4),
    "fuse_rmsnorm": (F.rms_norm.default, 5),
}
DTYPES = {"decoder": torch.bfloat16, "hf_llama": torch.float32}


@pytest.mark.parametrize("ir", ["export", "aot", "dynamo"])
@pytest.mark.parametrize("model", sorted(DTYPES))
def test_same_sites_with_or_without_canonicalization(model, ir):
    for fusion, (op, sites) in SITES.items():
        for before in ([], CANONICALIZE):
            cap = captured(model, ir)
            fp.Pipeline([*before, fusion]).run(cap.gm)
            assert count(cap.gm, op) == sites, (fusion, before)
            cap.gm.graph.lint()
            for got, want in zip(cap.run(), cap.expected):
                assert_close(got, want, DTYPES[model])


def test_the_documented_pipeline_fuses_every_site_of_a_raw_export():
    """The pipeline docs/cli.md shows, on a Hugging Face model exported as users export it:
    float32, no canonicalization, no-op casts between each residual add and its norm."""
    cap = captured("hf_llama", "export")
    spec = "remove_assert_ops,fuse_add_rmsnorm,fuse_rmsnorm,fixpoint(cse,dce)"
    report = fp.Pipeline.parse(spec).run(cap.gm).report
    assert report.find("fuse_add_rmsnorm").stats["rewrites"] == 4
    assert report.find("fuse_rmsnorm").stats["rewrites"] == 1
    # no near misses left behind (a hint is found when read: an empty one says nothing)
    assert not [h for rec in report.passes for h in rec.hints if str(h)]
    for got, want in zip(cap.run(), cap.expected):
        assert_close(got, want, torch.float32)


class T5RMSNorm(LlamaRMSNorm):
    """T5's spelling (also in T5-derived models): squares ``x.float()`` but multiplies the
    original ``x``, which the product promotes to float32 (the same numbers as the upcast)."""

    def forward(self, hidden_states):
        variance = hidden_states.to(torch.float32).pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        if self.weight.dtype in [torch.float16, torch.bfloat16]:
            hidden_states = hidden_states.to(self.weight.dtype)
        return self.weight * hidden_states


class FlatBlock(nn.Module):
    """Tokens flattened between the residual add and the norm (``[b, s, d] -> [1, b*s, d]``),
    the norm's output reshaped back; the sum flows on in its own shape."""

    def __init__(self, hidden=32, eps=1e-6):
        super().__init__()
        self.norm1, self.norm2 = LlamaRMSNorm(hidden, eps), LlamaRMSNorm(hidden, eps)
        self.o = nn.Linear(hidden, hidden, bias=False)
        self.mlp = nn.Linear(hidden, hidden, bias=False)

    def forward(self, x):
        b, s, d = x.shape
        x = x + self.o(self.norm1(x))
        y = self.norm2(x.reshape(b * s, d).unsqueeze(0))
        return x + self.mlp(y).view(b, s, d)


_BLOCKS = {  # bf16 where T5 differs from the upcast spelling; float32 adds no-op casts
    "t5": (
        functools.partial(Block, T5RMSNorm),
        torch.bfloat16,
        {"fuse_add_rmsnorm": 2, "fuse_rmsnorm": 3},
    ),
    "flat": (FlatBlock, torch.float32, {"fuse_add_rmsnorm": 1, "fuse_rmsnorm": 2}),
}


@pytest.mark.parametrize("ir", ["export", "aot", "dynamo"])
@pytest.mark.parametrize("block", sorted(_BLOCKS))
def test_t5_norms_and_views_between_add_and_norm(block, ir):
    factory, dtype, sites = _BLOCKS[block]
    for fusion, want in sites.items():
        op = SITES[fusion][0]
        for before in ([], CANONICALIZE):
            cap = Captured(factory, ir, dtype)
            expected = cap.run()
            fp.Pipeline([*before, fusion]).run(cap.gm)
            assert count(cap.gm, op) == want, (fusion, before)
            cap.gm.graph.lint()
            assert_close(cap.run(), expected, dtype)


def test_flattened_norm_gets_its_shape_back_under_torch_compile():
    cap = Captured(FlatBlock, "export", torch.bfloat16)
    expected = cap.run()
    fp.Pipeline(["fuse_add_rmsnorm", "fuse_rmsnorm"]).run(cap.gm)
    fused = next(n for n in cap.gm.graph.nodes if n.target is F.fused_add_rmsnorm.default)
    normed = next(u for u in fused.users if u.args[1] == 0)
    (view,) = normed.users  # the norm read x.reshape(b * s, d): replayed on its output
    assert tuple(view.meta["val"].shape) == (10, 32)
    torch._dynamo.reset()
    compiled = torch.compile(cap.ep.module())(*cap.args)
    torch._dynamo.reset()
    assert_close(compiled, expected, torch.bfloat16)


_QUANT = functools.partial(QuantBlock)
_QUANT.inputs = functools.partial(inputs, n=2)


@pytest.mark.parametrize("ir", ["export", "aot", "dynamo"])
def test_quant_fusion_with_or_without_canonicalization(ir):
    for before in ([], CANONICALIZE):
        cap = Captured(_QUANT, ir, torch.float32)
        expected = cap.run()
        fp.Pipeline([*before, "fuse_add_rmsnorm_quant"]).run(cap.gm)
        assert count(cap.gm, F.fused_add_rmsnorm_quant.default) == 1, before
        # int8 codes may differ by one where the fused norm rounds once instead of twice
        torch.testing.assert_close(cap.run().float(), expected.float(), rtol=0.05, atol=0.05)
