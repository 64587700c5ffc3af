"""DecoderConfig's variants: fused projections and head widths compute what the plain
decoder computes with the same weights; the defaults leave the model as it was."""

from __future__ import annotations

import torch

from fxpass.models.llama import build_decoder


def _same_weights(fused, plain) -> None:
    sd = plain.state_dict()
    out = dict(sd)
    for i in range(plain.cfg.layers):
        p = f"layers.{i}."
        if fused.cfg.fused_qkv:
            names = [f"{p}self_attn.{n}_proj.weight" for n in "qkv"]
            out[f"{p}self_attn.qkv_proj.weight"] = torch.cat([out.pop(n) for n in names])
        if fused.cfg.fused_gate_up:
            names = [f"{p}mlp.gate_proj.weight", f"{p}mlp.up_proj.weight"]
            out[f"{p}mlp.gate_up_proj.weight"] = torch.cat([out.pop(n) for n in names])
    fused.load_state_dict(out)


def test_fused_projections_compute_the_same():
    plain = build_decoder(layers=2, dtype=torch.float32, kv_heads=2)
    fused = build_decoder(layers=2, dtype=torch.float32, kv_heads=2, fused_qkv=True,
                          fused_gate_up=True)  # fmt: skip
    _same_weights(fused, plain)
    (ids,) = plain.example_inputs()
    torch.testing.assert_close(fused(ids), plain(ids))


def test_head_size_sets_the_attention_width():
    model = build_decoder(layers=1, dtype=torch.float32, head_size=32)
    assert model.layers[0].self_attn.q_proj.weight.shape == (128, 64)
    assert model.layers[0].self_attn.o_proj.weight.shape == (64, 128)
    assert model(*model.example_inputs()).shape == (1, 8, 128)


def test_defaults_are_the_old_model():
    model = build_decoder()
    names = [n for n, _ in model.named_parameters() if n.startswith("layers.0.")]
    assert names == [
        "layers.0.input_layernorm.weight",
        "layers.0.self_attn.q_proj.weight",
        "layers.0.self_attn.k_proj.weight",
        "layers.0.self_attn.v_proj.weight",
        "layers.0.self_attn.o_proj.weight",
        "layers.0.post_attention_layernorm.weight",
        "layers.0.mlp.gate_proj.weight",
        "layers.0.mlp.up_proj.weight",
        "layers.0.mlp.down_proj.weight",
    ]
