"""A tiny Llama-style decoder, built from a config with random weights.

It is the model the demo, the tests and the benchmarks run on. Real model families spell
RMSNorm differently, and fusion passes must find every spelling, so ``norm_style`` picks one:

========== ==================================================================================
style       what the norm computes (``x`` the input, ``w`` the weight)
========== ==================================================================================
llama       ``w * (x.float() * rsqrt(mean(x.float()**2) + eps)).to(dtype)`` (Llama, Mistral,
            Qwen2/3, Phi-3 with ``eps=1e-5``)
gemma       ``(x.float() * rsqrt(mean(x.float()**2) + eps) * (1 + w.float())).type_as(x)``
plain       ``x * rsqrt(mean(x**2) + eps) * w``: no float32 upcast, weight last
========== ==================================================================================

``qk_norm=True`` adds per-head RMSNorms over ``head_dim`` to queries and keys (Qwen3,
Gemma3), and ``sandwich_norm=True`` adds Gemma's post-attention / post-MLP norms, which
feed the residual add instead of following it. ``qk_norm_transposed=True`` puts the q/k
norms on the ``(batch, heads, seq, head_dim)`` transposed view instead, with Gemma's
``(1 + w)`` weight: their inputs and results are not contiguous, which a fused op must
respect. ``fused_qkv=True`` computes queries, keys and values with one linear layer and
``fused_gate_up=True`` the MLP's gate and up projections (Phi-3); ``head_size`` sets a
head width other than ``hidden // heads`` (Qwen3, Gemma). All default off, and then the
model is the same, weight for weight.

Two block shapes give independent work to overlap on streams: ``moe_experts=N`` replaces
the MLP with a mixture of ``N`` routed experts (softmax router, top-``moe_top_k``, weights
renormalized; every expert computes every token, weighted — dense, exportable) plus a
shared expert every token goes through (DeepSeek / Qwen-MoE style), and
``parallel_block=True`` reads one norm into attention and MLP side by side and adds both to
the residual (GPT-J, Phi-2).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["DecoderConfig", "RMSNorm", "TinyDecoder", "build_decoder"]


@dataclass(frozen=True)
class DecoderConfig:
    """Shape and flavour of a :class:`TinyDecoder`. The defaults are the anchors' model."""

    layers: int = 2
    hidden: int = 64
    heads: int = 4
    kv_heads: int = 4
    intermediate: int = 128
    vocab: int = 128
    seq_len: int = 8
    batch: int = 1
    eps: float = 1e-6
    norm_style: str = "llama"
    qk_norm: bool = False
    sandwich_norm: bool = False
    qk_norm_transposed: bool = False
    dtype: torch.dtype = torch.bfloat16
    rope_theta: float = 10000.0
    fused_qkv: bool = False
    fused_gate_up: bool = False
    head_size: int | None = None
    moe_experts: int = 0
    moe_top_k: int = 2
    moe_shared_expert: bool = True
    parallel_block: bool = False

    def __post_init__(self) -> None:
        if self.norm_style not in ("llama", "gemma", "plain"):
            raise ValueError(
                f"norm_style must be 'llama', 'gemma' or 'plain', not {self.norm_style!r}"
            )
        if self.head_size is None and self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be a multiple of heads ({self.heads})")
        if self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads")
        if self.moe_experts and not 1 <= self.moe_top_k <= self.moe_experts:
            raise ValueError(
                f"moe_top_k ({self.moe_top_k}) must be between 1 and moe_experts "
                f"({self.moe_experts})"
            )
        if self.parallel_block and self.sandwich_norm:
            raise ValueError("parallel_block has one norm per layer: drop sandwich_norm")

    @property
    def head_dim(self) -> int:
        return self.head_size or self.hidden // self.heads

    def replace(self, **changes) -> DecoderConfig:
        return dataclasses.replace(self, **changes)


class RMSNorm(nn.Module):
    """RMSNorm in one of the spellings real model families use (see the module docstring)."""

    def __init__(self, dim: int, eps: float, style: str) -> None:
        super().__init__()
        self.eps = eps
        self.style = style
        init = torch.zeros(dim) if style == "gemma" else torch.ones(dim)
        self.weight = nn.Parameter(init + 0.1 * torch.randn(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.style == "plain":
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.style == "gemma":
            return (h * (1.0 + self.weight.float())).type_as(x)
        return self.weight * h.to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class _Attention(nn.Module):
    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d = cfg.head_dim
        self.sizes = [cfg.heads * d, cfg.kv_heads * d, cfg.kv_heads * d]
        if cfg.fused_qkv:
            self.qkv_proj = nn.Linear(cfg.hidden, sum(self.sizes), bias=False)
        else:
            self.q_proj = nn.Linear(cfg.hidden, cfg.heads * d, bias=False)
            self.k_proj = nn.Linear(cfg.hidden, cfg.kv_heads * d, bias=False)
            self.v_proj = nn.Linear(cfg.hidden, cfg.kv_heads * d, bias=False)
        self.o_proj = nn.Linear(cfg.heads * d, cfg.hidden, bias=False)
        if cfg.qk_norm or cfg.qk_norm_transposed:
            style = "gemma" if cfg.qk_norm_transposed else cfg.norm_style
            self.q_norm = RMSNorm(d, cfg.eps, style)
            self.k_norm = RMSNorm(d, cfg.eps, style)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        b, s, _ = x.shape
        if cfg.fused_qkv:
            q, k, v = self.qkv_proj(x).split(self.sizes, dim=-1)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = q.view(b, s, cfg.heads, cfg.head_dim)
        k = k.view(b, s, cfg.kv_heads, cfg.head_dim)
        v = v.view(b, s, cfg.kv_heads, cfg.head_dim)
        if cfg.qk_norm and not cfg.qk_norm_transposed:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if cfg.qk_norm_transposed:  # per head, on the (b, heads, s, d) view
            q, k = self.q_norm(q), self.k_norm(k)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        if cfg.kv_heads != cfg.heads:
            rep = cfg.heads // cfg.kv_heads
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, cfg.heads * cfg.head_dim))


class _MLP(nn.Module):
    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.fused = cfg.fused_gate_up
        if self.fused:
            self.gate_up_proj = nn.Linear(cfg.hidden, 2 * cfg.intermediate, bias=False)
        else:
            self.gate_proj = nn.Linear(cfg.hidden, cfg.intermediate, bias=False)
            self.up_proj = nn.Linear(cfg.hidden, cfg.intermediate, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate, cfg.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused:
            gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        return self.down_proj(F.silu(gate) * up)


class _MoE(nn.Module):
    """Routed experts (dense dispatch: each expert sees every token, weighted) + a shared one."""

    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.top_k = cfg.moe_top_k
        self.gate = nn.Linear(cfg.hidden, cfg.moe_experts, bias=False)
        self.experts = nn.ModuleList(_MLP(cfg) for _ in range(cfg.moe_experts))
        self.shared_expert = _MLP(cfg) if cfg.moe_shared_expert else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        probs = F.softmax(self.gate(x), dim=-1, dtype=torch.float32)
        top_w, top_i = torch.topk(probs, self.top_k, dim=-1)
        top_w = top_w / top_w.sum(-1, keepdim=True)
        weights = torch.zeros_like(probs).scatter(-1, top_i, top_w).to(x.dtype)
        out = self.experts[0](x) * weights[..., 0:1]
        for e in range(1, len(self.experts)):
            out = out + self.experts[e](x) * weights[..., e : e + 1]
        if self.shared_expert is not None:
            out = out + self.shared_expert(x)
        return out


class _DecoderLayer(nn.Module):
    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.input_layernorm = RMSNorm(cfg.hidden, cfg.eps, cfg.norm_style)
        self.self_attn = _Attention(cfg)
        if not cfg.parallel_block:
            self.post_attention_layernorm = RMSNorm(cfg.hidden, cfg.eps, cfg.norm_style)
        self.mlp = _MoE(cfg) if cfg.moe_experts else _MLP(cfg)
        if cfg.sandwich_norm:
            self.post_attn_out_norm = RMSNorm(cfg.hidden, cfg.eps, cfg.norm_style)
            self.post_mlp_out_norm = RMSNorm(cfg.hidden, cfg.eps, cfg.norm_style)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if self.cfg.parallel_block:
            h = self.input_layernorm(x)
            return x + self.self_attn(h, cos, sin) + self.mlp(h)
        h = self.self_attn(self.input_layernorm(x), cos, sin)
        if self.cfg.sandwich_norm:
            h = self.post_attn_out_norm(h)
        x = x + h
        h = self.mlp(self.post_attention_layernorm(x))
        if self.cfg.sandwich_norm:
            h = self.post_mlp_out_norm(h)
        return x + h


class TinyDecoder(nn.Module):
    """A Llama-style decoder-only transformer: token ids in, logits out."""

    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab, cfg.hidden)
        self.layers = nn.ModuleList(_DecoderLayer(cfg) for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.hidden, cfg.eps, cfg.norm_style)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab, bias=False)
        d = cfg.head_dim
        inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2).float() / d))
        freqs = torch.outer(torch.arange(cfg.seq_len).float(), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("rope_cos", emb.cos(), persistent=False)
        self.register_buffer("rope_sin", emb.sin(), persistent=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        s = input_ids.shape[1]
        cos = self.rope_cos[:s].to(x.dtype)
        sin = self.rope_sin[:s].to(x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.norm(x))

    def example_inputs(self, seed: int = 0) -> tuple[torch.Tensor]:
        gen = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, self.cfg.vocab, (self.cfg.batch, self.cfg.seq_len), generator=gen)
        return (ids,)


def build_decoder(cfg: DecoderConfig | None = None, *, seed: int = 0, **overrides) -> TinyDecoder:
    """Build a :class:`TinyDecoder` in eval mode with seeded random weights.

    >>> model = build_decoder(layers=1)
    >>> model(*model.example_inputs()).shape
    torch.Size([1, 8, 128])
    """
    cfg = (cfg or DecoderConfig()).replace(**overrides) if overrides else (cfg or DecoderConfig())
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = TinyDecoder(cfg)
    return model.to(cfg.dtype).eval()
