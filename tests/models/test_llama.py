"""The tiny decoder's variants: fused projections and head widths compute what the plain
decoder computes with the same weights; MoE (shared + routed experts) and parallel blocks;
the q/k-norm-on-a-transposed-view one end to end.

``qk_norm_transposed`` is the model family that found the fused ops' layout miscompile
(issue 10): per-head q/k RMSNorms with Gemma's ``(1 + w)`` weight on the transposed
``(b, heads, s, d)`` view. Before the fix, Inductor's size asserts failed on it, and with
them off it returned wrong logits; each way a user compiles or applies fxpass is run here
against eager in float32.
"""

from __future__ import annotations

import pytest
import torch
import torch._inductor.config as inductor_config

import fxpass as fp
from fxpass.models.llama import DecoderConfig, build_decoder

from _models import decoder, exported

RMS = torch.ops.fxpass.rms_norm.default
CONFIG = {"layers": 1, "qk_norm_transposed": True, "dtype": torch.float32}
TOL = {"rtol": 1e-5, "atol": 1e-5}


def test_default_model_is_unchanged_by_the_new_option():
    plain = build_decoder(layers=1)
    names = [n for n, _ in plain.named_parameters()]
    assert not any("q_norm" in n for n in names)
    off = build_decoder(layers=1, qk_norm_transposed=False)
    (ids,) = plain.example_inputs()
    assert torch.equal(plain(ids), off(ids))


def test_qk_norms_see_a_transposed_view_and_use_gemmas_weight():
    model = decoder(**CONFIG)
    seen = []
    attn = model.layers[0].self_attn
    handle = attn.q_norm.register_forward_hook(lambda m, args, out: seen.append(args[0]))
    model(*model.example_inputs())
    handle.remove()
    (x,) = seen
    assert x.shape == (1, 4, 8, 16) and not x.is_contiguous()  # (b, heads, s, head_dim)
    assert attn.q_norm.style == "gemma"


def _eager():
    model = decoder(**CONFIG)
    (ids,) = model.example_inputs()
    with torch.no_grad():
        return model, ids, model(ids)


@pytest.mark.parametrize("size_asserts", [True, False])
def test_compiled_with_the_fxpass_backend_equals_eager(size_asserts):
    model, ids, expected = _eager()
    torch._dynamo.reset()
    try:
        with torch.no_grad(), inductor_config.patch(size_asserts=size_asserts):
            got = torch.compile(model, backend="fxpass")(ids)
    finally:
        torch._dynamo.reset()
    torch.testing.assert_close(got, expected, **TOL)


def test_aten_graphs_run_eagerly_equal_eager():
    model, ids, expected = _eager()
    be = fp.backend(ir="aten", compiler="eager")
    torch._dynamo.reset()
    try:
        with torch.no_grad():
            got = torch.compile(model, backend=be)(ids)
    finally:
        torch._dynamo.reset()
    assert be.reports[0].stats()["fuse_rmsnorm.rewrites"] == 3  # q, k and the final norm
    torch.testing.assert_close(got, expected, **TOL)


def test_apply_on_an_unlowered_export_program_equals_eager():
    _, ids, expected = _eager()
    ep = exported(decompose=False, **CONFIG).run_decompositions({})
    result = fp.apply(ep)
    assert sum(n.target is RMS for n in result.graph_module.graph.nodes) == 3
    torch.testing.assert_close(result.program.module()(ids), expected, **TOL)


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
