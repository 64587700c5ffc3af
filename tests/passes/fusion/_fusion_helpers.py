"""Models and captures the fusion tests share.

Every RMSNorm spelling the fusion passes must find is written here as the model families
write it (Hugging Face's modeling code), plus look-alikes that must be left alone, a small
residual block to put them in, and a W8A8-style quantized block. Captures (torch.export, AOT
ATen, Dynamo) are cached; tests get fresh copies.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

import torch
import torch._functorch.config
import torch._inductor.config
from _captures import dynamo_capture
from torch import nn

import fxpass as fp

F = torch.ops.fxpass


# ----- norms, as the families spell them ----------------------------------------------------
class LlamaRMSNorm(nn.Module):
    """Llama's RMSNorm; Mistral, Qwen2, Qwen3 and Phi-3 use this same code."""

    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size) + 0.1 * torch.randn(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class GemmaRMSNorm(nn.Module):
    """Gemma's RMSNorm (Gemma, Gemma2, Gemma3): ``(1 + weight)``, multiplied in float32."""

    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(0.1 * torch.randn(dim))

    def _norm(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x):
        output = self._norm(x.float())
        output = output * (1.0 + self.weight.float())
        return output.type_as(x)


class WeightLastRMSNorm(LlamaRMSNorm):
    """Weight after the normalized value, upcast with ``.float()`` (InternLM-style)."""

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(dim=-1, keepdim=True) + self.variance_epsilon)
        return h.to(x.dtype) * self.weight


class SqrtRMSNorm(LlamaRMSNorm):
    """Divides by ``sqrt`` and squares by multiplying (no upcast)."""

    def forward(self, x):
        return self.weight * (
            x / torch.sqrt((x * x).mean(-1, keepdim=True) + self.variance_epsilon)
        )


class PlainRMSNorm(LlamaRMSNorm):
    """No float32 upcast at all, weight last."""

    def forward(self, x):
        return (
            x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon) * self.weight
        )


class PowRMSNorm(LlamaRMSNorm):
    """Gemma3n's and Gemma4's: ``x * pow(mean(x**2) + eps, -0.5)``, multiplied in float32."""

    def forward(self, x):
        h = x.float()
        mean_squared = h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon
        h = h * torch.pow(mean_squared, -0.5)
        return (h * self.weight.float()).type_as(x)


class StarStarRMSNorm(LlamaRMSNorm):
    """``(var + eps) ** -0.5`` (``operator.pow`` in Dynamo), weight first."""

    def forward(self, x):
        h = x.float()
        h = h * (h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon) ** -0.5
        return self.weight * h.to(x.dtype)


class ReciprocalRMSNorm(LlamaRMSNorm):
    """``x * (1 / sqrt(var + eps))`` (export writes ``reciprocal(sqrt(.)) * 1``)."""

    def forward(self, x):
        h = x.float()
        h = h * (1 / torch.sqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))
        return self.weight * h.to(x.dtype)


class ReciprocalMethodRMSNorm(LlamaRMSNorm):
    """``x * sqrt(var + eps).reciprocal()``, no upcast."""

    def forward(self, x):
        inv = torch.sqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon).reciprocal()
        return x * inv * self.weight


class DivPowRMSNorm(LlamaRMSNorm):
    """``x / (var + eps) ** 0.5``."""

    def forward(self, x):
        h = x.float()
        h = h / (h * h).mean(-1, keepdim=True).add(self.variance_epsilon).pow(0.5)
        return self.weight * h.to(x.dtype)


NORMS = {
    "llama": LlamaRMSNorm,
    "gemma": GemmaRMSNorm,
    "weight_last": WeightLastRMSNorm,
    "sqrt": SqrtRMSNorm,
    "plain": PlainRMSNorm,
    "pow": PowRMSNorm,
    "star_star": StarStarRMSNorm,
    "reciprocal": ReciprocalRMSNorm,
    "reciprocal_method": ReciprocalMethodRMSNorm,
    "div_pow": DivPowRMSNorm,
}


# ----- look-alikes -------------------------------------------------------------------------
class OtherDimNorm(LlamaRMSNorm):
    """Normalizes over dimension 1, not the last one."""

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(1, keepdim=True) + self.variance_epsilon)
        return self.weight * h.to(x.dtype)


class NoEpsNorm(LlamaRMSNorm):
    def forward(self, x):
        h = x.float()
        return self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True))).to(x.dtype)


class CubeNorm(LlamaRMSNorm):
    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(3).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * h.to(x.dtype)


class MatrixWeightNorm(LlamaRMSNorm):
    """A (1, D) weight: broadcasts like a norm weight, but is not one."""

    def __init__(self, hidden_size, eps=1e-6):
        super().__init__(hidden_size, eps)
        self.weight = nn.Parameter(torch.ones(1, hidden_size))


class EpsOutsideNorm(LlamaRMSNorm):
    """``rsqrt(var) + eps``: eps added after the root."""

    def forward(self, x):
        h = x.float()
        h = h * (torch.rsqrt(h.pow(2).mean(-1, keepdim=True)) + self.variance_epsilon)
        return self.weight * h.to(x.dtype)


class NoWeightNorm(LlamaRMSNorm):
    def forward(self, x):
        h = x.float()
        return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)).to(
            x.dtype
        )


class PowExponentNorm(LlamaRMSNorm):
    """``x * pow(var + eps, -1)``: divides by the mean square, not its root."""

    def forward(self, x):
        h = x.float()
        h = h * torch.pow(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon, -1.0)
        return self.weight * h.to(x.dtype)


class PowOtherDimNorm(PowRMSNorm):
    """The ``pow(., -0.5)`` spelling over dimension 1."""

    def forward(self, x):
        h = x.float()
        h = h * torch.pow(h.pow(2).mean(1, keepdim=True) + self.variance_epsilon, -0.5)
        return (h * self.weight.float()).type_as(x)


class ReciprocalNoRootNorm(LlamaRMSNorm):
    """``x * (1 / (var + eps))``: no square root."""

    def forward(self, x):
        h = x.float()
        h = h * (1 / (h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))
        return self.weight * h.to(x.dtype)


LOOKALIKES = {
    "pow_exponent": PowExponentNorm,
    "pow_other_dim": PowOtherDimNorm,
    "reciprocal_no_root": ReciprocalNoRootNorm,
    "other_dim": OtherDimNorm,
    "no_eps": NoEpsNorm,
    "cube": CubeNorm,
    "matrix_weight": MatrixWeightNorm,
    "eps_outside": EpsOutsideNorm,
    "no_weight": NoWeightNorm,
}


# ----- blocks ------------------------------------------------------------------------------
class Block(nn.Module):
    """Two residual sub-blocks and a final norm; optional per-head q/k norms."""

    def __init__(self, norm: type, hidden=32, heads=4, eps=1e-6, qk_norm=False):
        super().__init__()
        self.heads = heads
        self.norm1 = norm(hidden, eps)
        self.norm2 = norm(hidden, eps)
        self.final = norm(hidden, eps)
        self.q = nn.Linear(hidden, hidden, bias=False)
        self.o = nn.Linear(hidden, hidden, bias=False)
        self.mlp = nn.Linear(hidden, hidden, bias=False)
        self.qk_norm = norm(hidden // heads, eps) if qk_norm else None

    def forward(self, x):
        h = self.q(self.norm1(x))
        if self.qk_norm is not None:
            b, s, d = h.shape
            h = self.qk_norm(h.view(b, s, self.heads, d // self.heads)).reshape(b, s, d)
        x = x + self.o(torch.tanh(h))
        x = x + self.mlp(self.norm2(x))
        return self.final(x)


class QuantBlock(nn.Module):
    """A W8A8-style block: residual add, RMSNorm, static int8 quantization of the norm,
    an int8 matmul emulated in float32, dequantized; the residual sum flows on."""

    def __init__(self, hidden=32, eps=1e-6, norm: type = LlamaRMSNorm, clamp_min=-128):
        super().__init__()
        self.norm = norm(hidden, eps)
        self.register_buffer("scale", torch.tensor([0.02]))
        self.register_buffer("weight_q", torch.randint(-8, 8, (hidden, hidden), dtype=torch.int8))
        self.clamp_min = clamp_min

    def quant(self, y):
        scale = self.scale.float()  # the module may be cast to bf16: the scale stays float32
        return torch.clamp(torch.round(y.float() / scale), self.clamp_min, 127).to(torch.int8)

    def forward(self, x, h):
        s = x + h
        q = self.quant(self.norm(s))
        y = (q.float() @ self.weight_q.float().t()) * self.scale.float() * 0.01
        return s + y.to(s.dtype)


def build(module: nn.Module, dtype=torch.bfloat16, seed=0):
    torch.manual_seed(seed)
    return module.to(dtype).eval()


def inputs(dtype=torch.bfloat16, hidden=32, n=1, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(2, 5, hidden, generator=g).to(dtype) for _ in range(n))


# ----- captures ----------------------------------------------------------------------------
@functools.cache
def _capture(factory, ir: str, dtype):
    torch.manual_seed(0)
    model = factory().to(dtype).eval()
    args = factory.inputs(dtype) if hasattr(factory, "inputs") else inputs(dtype)
    if ir in ("export", "export_raw"):  # core ATen, or as torch.export.export leaves it
        ep = torch.export.export(model, args)
        return (ep.run_decompositions() if ir == "export" else ep), args
    if ir not in ("dynamo", "aot"):
        raise ValueError(ir)
    gm, real_inputs = dynamo_capture(model, args, ir)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    assert len(placeholders) == len(real_inputs), "AOT graph inputs are not Dynamo's inputs"
    return gm, real_inputs


class Captured:
    """A captured graph and a way to run it: ``.gm``, ``.run()``."""

    def __init__(self, factory, ir: str, dtype=torch.bfloat16):
        self.ir = ir
        if ir in ("export", "export_raw"):
            ep, args = _capture(factory, ir, dtype)
            self.ep = copy.deepcopy(ep)
            self.gm = self.ep.graph_module
            self.args = args
        else:
            gm, args = _capture(factory, ir, dtype)
            self.gm = copy.deepcopy(gm)
            self.args = args

    def run(self):
        if self.ir in ("export", "export_raw"):
            return self.ep.module()(*self.args)
        self.gm.recompile()
        out = self.gm(*self.args)
        return out[0] if isinstance(out, (tuple, list)) else out


def count(gm, target) -> int:
    return sum(1 for n in gm.graph.nodes if n.op == "call_function" and n.target == target)


def tolerance(dtype):
    return {torch.bfloat16: 3e-2, torch.float16: 4e-3, torch.float32: 1e-5}[dtype]


def assert_close(a, b, dtype):
    tol = tolerance(dtype)
    torch.testing.assert_close(a.float(), b.float(), rtol=tol, atol=tol)


def new_nodes(gm):
    return [n for n in gm.graph.nodes if "fxpass_provenance" in n.meta]


# ----- under torch.compile -------------------------------------------------------------------
def compiled_matches_eager(
    model: nn.Module, args: tuple, spec: str, *, tol: float = 1e-5, **backend: Any
):
    """Compile ``model`` with ``fxpass.backend(spec, **backend)`` (by default the passes run
    inside Inductor), check its outputs equal eager's within ``tol`` and return the
    pipeline's statistics."""
    be = fp.backend(spec, **backend)
    # no compile caches: a graph an earlier test compiled would be reused without the pass
    uncached = (
        torch._inductor.config.patch(fx_graph_cache=False),
        torch._functorch.config.patch(enable_autograd_cache=False),
    )
    torch._dynamo.reset()
    try:
        with torch.no_grad(), uncached[0], uncached[1]:
            expected = model(*args)
            got = torch.compile(model, backend=be, fullgraph=True)(*args)
    finally:
        torch._dynamo.reset()
    torch.testing.assert_close(got.float(), expected.float(), rtol=tol, atol=tol)
    return be.reports[0].stats()
