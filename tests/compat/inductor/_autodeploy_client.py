"""Transforms written as TensorRT-LLM's AutoDeploy writes them (auto_deploy/transform/library):
a ``PatternMatcherPass`` subclass, a pattern registered with ``register_replacement`` and a
``scalar_workaround`` for ``eps`` (RMSNorm -> one norm op), then a ``register_graph_pattern``
handler that fuses the residual add into it with ``match.replace_by_example``. It imports
Inductor's pattern matcher; the tests load it as it is and after ``install()``.
"""

from __future__ import annotations

import torch
from torch._inductor.pattern_matcher import (
    MULTIPLE,
    CallFunction,
    KeywordArg,
    Match,
    MultiOutputPattern,
    PatternMatcherPass,
    fwd_only,
    register_graph_pattern,
    register_replacement,
)

import fxpass.ops  # noqa: F401  (torch.ops.fxpass)

aten = torch.ops.aten
RMS_NORM = torch.ops.fxpass.rms_norm.default
FUSED_ADD_RMS_NORM = torch.ops.fxpass.fused_add_rmsnorm.default


class ADPatternMatcherPass(PatternMatcherPass):
    """AutoDeploy's pass: ``apply`` returns how many sites it rewrote."""

    def apply(self, graph: torch.fx.Graph) -> int:  # type: ignore[override]
        return super().apply(graph)


def _rms_norm_pattern(data: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    input_dtype = data.dtype
    data = data.to(torch.float32)
    variance = data.pow(2).mean(-1, keepdim=True)
    data = data * torch.rsqrt(variance + eps)
    return weight * data.to(input_dtype)


def _rms_norm_replacement(data: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return RMS_NORM(data, weight, eps)


def match_rms_norm(graph: torch.fx.Graph, dtypes=(torch.float32, torch.bfloat16)) -> int:
    """Stage 1: every RMSNorm spelled out in ATen becomes ``fxpass::rms_norm`` (any eps)."""
    patterns = ADPatternMatcherPass()
    for dtype in dtypes:
        dummy = [torch.randn(2, 8, 16, dtype=dtype), torch.randn(16, dtype=dtype)]
        register_replacement(
            _rms_norm_pattern,
            _rms_norm_replacement,
            dummy,
            fwd_only,
            patterns,
            scalar_workaround={"eps": 1e-6},
            skip_duplicates=True,
        )
    return patterns.apply(graph)


def fuse_add_rms_norm(graph: torch.fx.Graph) -> int:
    """Stage 2: ``rms_norm(x + residual)`` whose sum is also used elsewhere becomes one
    ``fxpass::fused_add_rmsnorm`` giving both."""
    patterns = ADPatternMatcherPass()
    total = CallFunction(aten.add.Tensor, KeywordArg("x"), KeywordArg("residual"), _users=MULTIPLE)
    norm = CallFunction(RMS_NORM, total, KeywordArg("weight"), KeywordArg("eps"))

    @register_graph_pattern(MultiOutputPattern([norm, total]), pass_dict=patterns)
    def _fuse(match: Match, x, residual, weight, eps) -> None:
        def fused(x, residual, weight):
            out = FUSED_ADD_RMS_NORM(x, residual, weight, eps)
            return out[0], out[1]

        match.replace_by_example(fused, [x, residual, weight])

    return patterns.apply(graph)
