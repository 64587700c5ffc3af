"""The embedded decoder's block variants: MoE (shared + routed experts) and parallel blocks."""

from __future__ import annotations

import pytest
import torch

from fxpass.models.llama import DecoderConfig, build_decoder


def test_moe_block_routes_top_k_and_adds_the_shared_expert():
    model = build_decoder(layers=1, moe_experts=4, moe_top_k=2, dtype=torch.float32)
    moe = model.layers[0].mlp
    assert len(moe.experts) == 4 and moe.shared_expert is not None
    x = torch.randn(1, 8, 64)
    probs = torch.softmax(moe.gate(x), -1)
    top_w, top_i = probs.topk(2, -1)
    top_w = top_w / top_w.sum(-1, keepdim=True)
    want = moe.shared_expert(x)
    for e, expert in enumerate(moe.experts):
        weight = (top_w * (top_i == e)).sum(-1, keepdim=True)
        want = want + expert(x) * weight
    torch.testing.assert_close(moe(x), want)
    (ids,) = model.example_inputs()
    assert model(ids).shape == (1, 8, 128)


def test_parallel_block_reads_one_norm_into_attention_and_mlp():
    model = build_decoder(layers=1, parallel_block=True, dtype=torch.float32)
    layer = model.layers[0]
    assert not hasattr(layer, "post_attention_layernorm")
    x = torch.randn(1, 8, 64)
    cos, sin = model.rope_cos.to(x.dtype), model.rope_sin.to(x.dtype)
    h = layer.input_layernorm(x)
    torch.testing.assert_close(layer(x, cos, sin), x + layer.self_attn(h, cos, sin) + layer.mlp(h))


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"moe_experts": 2, "moe_top_k": 3}, "moe_top_k"),
        ({"parallel_block": True, "sandwich_norm": True}, "parallel_block"),
    ],
)
def test_bad_variants_are_refused(changes, message):
    with pytest.raises(ValueError, match=message):
        DecoderConfig(**changes)


def test_defaults_build_the_dense_sequential_block():
    layer = build_decoder(layers=1).layers[0]
    assert hasattr(layer, "post_attention_layernorm")
    assert sorted(n for n, _ in layer.mlp.named_children()) == ["down_proj", "gate_proj", "up_proj"]
