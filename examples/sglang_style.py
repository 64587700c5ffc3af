"""SGLang style: PassManager(gm), add(PassClass), apply().

SGLang's NPU backend writes passes two ways: a class with static ``pattern`` and
``replacement`` functions, applied with ``replace_pattern`` (its ``NpuAddRmsNormQuantFuse``),
and a class whose instances edit the graph directly (its ``EraseCopy``). Both run unchanged
on ``fxpass.compat.sglang.PassManager``; here they fuse residual-add + RMSNorm of the tiny
Llama-style decoder into fxpass's fused op:

    python examples/sglang_style.py
"""

from __future__ import annotations

import torch
from _common import exported_decoder, show

import fxpass  # noqa: F401  (registers torch.ops.fxpass.*)
from fxpass.compat.sglang import PassManager

aten = torch.ops.aten


class EraseAsserts:
    """Direct graph manipulation: export's assert nodes hide the norms from patterns."""

    def __call__(self, graph_module: torch.fx.GraphModule) -> list:
        erased = []
        for node in list(graph_module.graph.nodes):
            if node.target is aten._assert_tensor_metadata.default:
                graph_module.graph.erase_node(node)
                erased.append(node.name)
        return erased


class AddRmsNormFuse:
    """replace_pattern: residual add + Llama RMSNorm -> fxpass.fused_add_rmsnorm."""

    @staticmethod
    def pattern(x, residual, weight):
        added = aten.add.Tensor(x, residual)
        h = aten._to_copy.default(added, dtype=torch.float32)
        var = aten.mean.dim(aten.pow.Tensor_Scalar(h, 2), [-1], True)
        normed = aten.mul.Tensor(h, aten.rsqrt.default(aten.add.Tensor(var, 1e-06)))
        return aten.mul.Tensor(weight, aten._to_copy.default(normed, dtype=torch.bfloat16)), added

    @staticmethod
    def replacement(x, residual, weight):
        fused = torch.ops.fxpass.fused_add_rmsnorm.default(x, residual, weight, 1e-06)
        return fused[0], fused[1]


def main() -> None:
    ep, _ = exported_decoder(layers=2)
    gm = ep.graph_module
    show("before", gm, contains="rsqrt")
    pm = PassManager(gm)
    pm.add(EraseAsserts)
    pm.add(AddRmsNormFuse)
    result = pm.apply()
    show("after", result.graph_module, contains="fused_add_rmsnorm")
    print(result.report)


if __name__ == "__main__":
    main()
