"""A fusion pass written as vLLM writes them (vllm/compilation/fusion.py): a pass class
holding a ``PatternMatcherPass``, one pattern class per fusion registered per epsilon and
dtype with ``fwd_only``, a multi-output replacement through a mutating custom op under
``auto_functionalized``, and an ``extra_check`` dtype guard. It imports Inductor's pattern
matcher, as vLLM does; the tests load it once as it is and once after
``fxpass.compat.inductor.install()``.
"""

from __future__ import annotations

import torch
import torch._inductor.pattern_matcher as pm
from torch._higher_order_ops.auto_functionalize import auto_functionalized
from torch._inductor.pattern_matcher import (
    Match,
    PatternMatcherPass,
    fwd_only,
    register_replacement,
)

import fxpass.ops  # noqa: F401  (torch.ops.fxpass)

RMS_NORM = torch.ops.fxpass.rms_norm.default
FUSED_ADD_RMS_NORM_ = torch.ops.fxpass.fused_add_rmsnorm_.default  # in place, as vLLM's _C op


def empty(*shape: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(*shape, dtype=dtype)


def same_dtype(match: Match) -> bool:
    """The guard vLLM added after an unsafe match corrupted Gemma's output: the weight must
    have the input's dtype."""
    x = match.kwargs["input"].meta["val"]
    w = match.kwargs["weight"].meta["val"]
    return x.dtype == w.dtype


class RMSNormPattern:
    def __init__(self, epsilon: float, dtype: torch.dtype) -> None:
        self.epsilon = epsilon
        self.dtype = dtype

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.epsilon)
        return weight * h.to(x.dtype)

    def register(self, pm_pass: PatternMatcherPass) -> None:
        def pattern(input: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
            return self.rms_norm(input, weight)

        def replacement(input: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
            return RMS_NORM(input, weight, self.epsilon)

        inputs = [empty(5, 16, dtype=self.dtype), empty(16, dtype=self.dtype)]
        register_replacement(
            pattern, replacement, inputs, fwd_only, pm_pass, extra_check=same_dtype
        )


class FusedAddRMSNormPattern(RMSNormPattern):
    def register(self, pm_pass: PatternMatcherPass) -> None:
        def pattern(input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor):
            total = input + residual
            return self.rms_norm(total, weight), total

        def replacement(input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor):
            at = auto_functionalized(
                FUSED_ADD_RMS_NORM_, x=input, residual=residual, weight=weight, eps=self.epsilon
            )
            return at[1], at[2]

        inputs = [empty(5, 16, dtype=self.dtype), empty(5, 16, dtype=self.dtype)]
        inputs.append(empty(16, dtype=self.dtype))
        register_replacement(
            pattern, replacement, inputs, fwd_only, pm_pass, extra_check=same_dtype
        )


class RMSNormFusionPass:
    """vLLM's ``RMSNormQuantFusionPass`` shape: ``__call__(graph)`` applies the patterns and
    keeps ``matched_count``."""

    def __init__(self, epsilons=(1e-5, 1e-6), dtypes=(torch.float32, torch.bfloat16)) -> None:
        self.patterns = PatternMatcherPass(pass_name="rmsnorm_fusion_pass")
        for epsilon in epsilons:
            for dtype in dtypes:
                FusedAddRMSNormPattern(epsilon, dtype).register(self.patterns)
                RMSNormPattern(epsilon, dtype).register(self.patterns)
            pm._seen_patterns.clear()  # as vLLM does, to register per epsilon
        self.matched_count = 0

    def __call__(self, graph: torch.fx.Graph) -> None:
        self.matched_count = self.patterns.apply(graph)


class AddRMSNormPattern(RMSNormPattern):
    """A norm of a residual sum, replaced by the norm op on a recomputed sum: the sum also
    feeds the next residual add, so Inductor's rules (an intermediate with another user)
    reject every site but the last layer's (vllm#41825's shape: one value, two consumers)."""

    def register(self, pm_pass: PatternMatcherPass) -> None:
        def pattern(input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor):
            return self.rms_norm(input + residual, weight)

        def replacement(input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor):
            return RMS_NORM(input + residual, weight, self.epsilon)

        inputs = [empty(5, 16, dtype=self.dtype), empty(5, 16, dtype=self.dtype)]
        inputs.append(empty(16, dtype=self.dtype))
        register_replacement(
            pattern, replacement, inputs, fwd_only, pm_pass, extra_check=same_dtype
        )


class AddRMSNormFusionPass(RMSNormFusionPass):
    def __init__(self, epsilons=(1e-5, 1e-6), dtypes=(torch.float32,)) -> None:
        self.patterns = PatternMatcherPass(pass_name="add_rmsnorm_fusion_pass")
        for epsilon in epsilons:
            for dtype in dtypes:
                AddRMSNormPattern(epsilon, dtype).register(self.patterns)
            pm._seen_patterns.clear()
        self.matched_count = 0
