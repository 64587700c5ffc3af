"""The fused kernels vLLM's fusions rewrite to (RMSNorm and SiLU-and-mul + fp8 quantization,
q/k RMSNorm + rotary embedding), which vLLM's CPU build does not register: defined here with
vLLM's schemas (``csrc``'s ``torch_bindings.cpp``) and reference bodies in plain PyTorch, so
the pass module imports and its replacements trace and run on CPU. Import after
``current_platform.import_kernels()`` and before ``vllm.compilation.passes.fusion``.
"""

from __future__ import annotations

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max

_lib = torch.library.Library("_C", "FRAGMENT")  # vLLM's namespace, as its build

SCHEMAS = {
    "rms_norm_static_fp8_quant": (
        "rms_norm_static_fp8_quant(Tensor! result, Tensor input, Tensor weight, "
        "Tensor scale, float epsilon) -> ()"
    ),
    "fused_add_rms_norm_static_fp8_quant": (
        "fused_add_rms_norm_static_fp8_quant(Tensor! result, Tensor input, "
        "Tensor! residual, Tensor weight, Tensor scale, float epsilon) -> ()"
    ),
    "rms_norm_dynamic_per_token_quant": (
        "rms_norm_dynamic_per_token_quant(Tensor! result, Tensor input, Tensor weight, "
        "Tensor! scale, float epsilon, Tensor? scale_ub, Tensor!? residual) -> ()"
    ),
    "rms_norm_per_block_quant": (
        "rms_norm_per_block_quant(Tensor! result, Tensor input, Tensor weight, "
        "Tensor! scale, float epsilon, Tensor? scale_ub, Tensor!? residual, "
        "int group_size, bool is_scale_transposed) -> ()"
    ),
    "per_token_group_fp8_quant": (
        "per_token_group_fp8_quant(Tensor input, Tensor! output_q, Tensor! output_s, "
        "int group_size, float eps, float fp8_min, float fp8_max, bool scale_ue8m0, "
        "bool dummy_is_scale_transposed, bool dummy_is_tma_aligned) -> ()"
    ),
    "fused_qk_norm_rope": (
        "fused_qk_norm_rope(Tensor! qkv, int num_heads_q, int num_heads_k, int num_heads_v, "
        "int head_dim, float eps, Tensor q_weight, Tensor k_weight, Tensor cos_sin_cache, "
        "bool is_neox, Tensor position_ids, int forced_token_heads_per_warp=-1) -> ()"
    ),
    "silu_and_mul_quant": ("silu_and_mul_quant(Tensor! result, Tensor input, Tensor scale) -> ()"),
}


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return (h.to(x.dtype) * weight).float()


def _static_quant(result, y, scale):
    result.copy_((y / scale.float()).clamp(-FP8_MAX, FP8_MAX).to(result.dtype))


def rms_norm_static_fp8_quant(result, input, weight, scale, epsilon):
    _static_quant(result, _rms(input, weight, epsilon), scale)


def fused_add_rms_norm_static_fp8_quant(result, input, residual, weight, scale, epsilon):
    residual.add_(input)
    _static_quant(result, _rms(residual, weight, epsilon), scale)


def _dynamic_quant(result, y, scale, scale_ub, groups):
    g = y.reshape(*y.shape[:-1], groups, -1)
    s = g.abs().amax(-1, keepdim=True) / FP8_MAX
    if scale_ub is not None:
        s = s.clamp(max=scale_ub.float())
    s = s.clamp(min=1e-10)
    result.copy_((g / s).clamp(-FP8_MAX, FP8_MAX).reshape(y.shape).to(result.dtype))
    scale.copy_(s.reshape(scale.shape).to(scale.dtype))


def rms_norm_dynamic_per_token_quant(result, input, weight, scale, epsilon, scale_ub, residual):
    if residual is not None:
        residual.add_(input)
        input = residual
    _dynamic_quant(result, _rms(input, weight, epsilon), scale, scale_ub, 1)


def rms_norm_per_block_quant(
    result, input, weight, scale, epsilon, scale_ub, residual, group_size, is_scale_transposed
):
    if residual is not None:
        residual.add_(input)
        input = residual
    y = _rms(input, weight, epsilon)
    groups = y.shape[-1] // group_size
    s = torch.empty(*y.shape[:-1], groups, dtype=torch.float32)
    _dynamic_quant(result, y, s, scale_ub, groups)
    scale.copy_((s.t() if is_scale_transposed else s).reshape(scale.shape))


def per_token_group_fp8_quant(
    input, output_q, output_s, group_size, eps, fp8_min, fp8_max, scale_ue8m0, transposed, tma
):
    groups = input.shape[-1] // group_size
    g = input.float().reshape(*input.shape[:-1], groups, group_size)
    s = (g.abs().amax(-1, keepdim=True) / fp8_max).clamp(min=eps)
    output_q.copy_((g / s).clamp(fp8_min, fp8_max).reshape(input.shape).to(output_q.dtype))
    output_s.copy_(s.reshape(output_s.shape))


def silu_and_mul_quant(result, input, scale):
    d = input.shape[-1] // 2
    y = torch.nn.functional.silu(input[..., :d].float()) * input[..., d:].float()
    _static_quant(result, y, scale)


def _head_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dimension (one head), as ``vllm.ir.ops.rms_norm``'s native form:
    float32 statistics, rounded to the weight's dtype before the weight multiplies."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return (h.to(weight.dtype) * weight).to(x.dtype)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, is_neox: bool) -> torch.Tensor:
    """Rotary embedding of ``x`` [tokens, heads, rotary_dim] by per-token ``cos``/``sin``
    [tokens, rotary_dim / 2] (NeoX rotates the two halves, GPT-J the even and odd elements),
    in float32 and rounded once, as vLLM's CPU kernel ``_C.rotary_embedding`` computes it —
    except that its AVX2 build truncates float32 to bf16 on the NeoX path (vectorised), where
    this rounds to nearest: bit-identical to it in fp16 and for bf16 GPT-J, one bf16 ulp
    apart on some elements for bf16 NeoX."""
    cos = cos.unsqueeze(-2).float()
    sin = sin.unsqueeze(-2).float()
    h = x.float()
    x1, x2 = h.chunk(2, dim=-1) if is_neox else (h[..., ::2], h[..., 1::2])
    o1 = x1 * cos - x2 * sin
    o2 = x2 * cos + x1 * sin
    out = torch.cat((o1, o2), dim=-1) if is_neox else torch.stack((o1, o2), -1).flatten(-2)
    return out.to(x.dtype)


def fused_qk_norm_rope(
    qkv,
    num_heads_q,
    num_heads_k,
    num_heads_v,
    head_dim,
    eps,
    q_weight,
    k_weight,
    cos_sin_cache,
    is_neox,
    position_ids,
    forced_token_heads_per_warp=-1,
):
    """In place on ``qkv`` [tokens, (q + k + v heads) * head_dim]: each q head and each k head
    RMS-normalised with its weight, then rotated by the position's row of ``cos_sin_cache``
    [max_position, rotary_dim] (cos half, then sin half) on its first rotary_dim elements; v
    untouched: the unfused sequence QKNormRoPEFusionPass replaces, as vLLM's Helion kernel's
    baseline writes it (``vllm.ir.ops.rms_norm`` per head, then the rotation)."""
    heads = qkv.view(qkv.shape[0], num_heads_q + num_heads_k + num_heads_v, head_dim)
    rotary_dim = cos_sin_cache.shape[-1]
    cos, sin = cos_sin_cache.index_select(0, position_ids.flatten()).chunk(2, dim=-1)
    for first, count, weight in ((0, num_heads_q, q_weight), (num_heads_q, num_heads_k, k_weight)):
        x = _head_rms_norm(heads[:, first : first + count], weight.reshape(-1), eps)
        rotated = _rope(x[..., :rotary_dim], cos, sin, is_neox)
        heads[:, first : first + count].copy_(torch.cat((rotated, x[..., rotary_dim:]), dim=-1))


def _fake(*args, **kwargs) -> None:
    """They only write into their arguments: under fake tensors (tracing) nothing to do, as
    vLLM's CUDA kernels' fake implementations."""


for _name, _schema in SCHEMAS.items():
    if not hasattr(torch.ops._C, _name):
        _lib.define(_schema)
        _lib.impl(_name, globals()[_name], "CPU")
        torch.library.register_fake(f"_C::{_name}", _fake, lib=_lib)
