"""module:function TARGETs for the CLI tests (imported by `fxpass` because the user asked)."""

from __future__ import annotations

import torch

from fxpass.models.llama import build_decoder
from fxpass.rewrite import P, Rule, rules


def tiny():
    """A 2-layer tiny decoder and its example inputs."""
    model = build_decoder(layers=2)
    return model, model.example_inputs()


def broken():
    raise ValueError("this target is broken on purpose")


def not_a_model():
    return 42


def tiny_fp32():
    """The tiny decoder in float32, exported as users export it (no decompositions): the
    graph keeps a no-op ``.to(torch.float32)`` between each residual add and its norm."""
    model = build_decoder(layers=2, dtype=torch.float32)
    return torch.export.export(model, model.example_inputs())


def _strict_add_norm():
    """A residual add + RMSNorm rule that does not see through casts (near misses above)."""
    aten = torch.ops.aten
    total = P(aten.add.Tensor, P.node("x"), P.node("r")).named("sum")
    h = P.cast(total, torch.float32)
    var = P(aten.mean.dim, P(aten.pow.Tensor_Scalar, h, 2), [-1], True)
    eps = P(aten.add.Tensor, var, P.const("eps"))
    normed = P(aten.mul.Tensor, h, P(aten.rsqrt.default, eps))
    norm = P(aten.mul.Tensor, P.node("w"), P.cast(normed, torch.float32))

    def fuse(x, r, w, eps):
        out = torch.ops.fxpass.fused_add_rmsnorm(x, r, w, eps)
        return out[0], out[1]

    return rules("strict_add_norm", [Rule(norm, fuse, outputs=["sum"], name="strict")])


strict_add_norm = _strict_add_norm()


class _Bitcast(torch.nn.Module):
    """bf16 math beside a bit-level view of the input (``view(int16)``): the view has a
    fixed dtype contract, so the float32 run of the original cannot be made."""

    def forward(self, x):
        return x * 2.0 + 1.0, x.view(torch.int16).reshape(2, 2)


def bf16_bitcast():
    """A bf16 program whose ``--verify`` has no float32 reference."""
    return _Bitcast(), (torch.randn(4, dtype=torch.bfloat16),)


class _Grads(torch.nn.Module):
    """bf16 math inside ``torch.no_grad()``: exported as a ``wrap_with_set_grad_enabled``
    higher-order op around a subgraph (as Hugging Face's rotary embeddings are)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4, dtype=torch.bfloat16))

    def forward(self, x):
        with torch.no_grad():
            y = (x * self.w).exp()
        return y * 3.0


def bf16_no_grad():
    """A bf16 program with a subgraph under a higher-order op: its float32 run works."""
    return torch.export.export(_Grads(), (torch.randn(4, dtype=torch.bfloat16),))
