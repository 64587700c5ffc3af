"""scalar_to_tensor: numbers in tensor arguments become 0-d tensors, results unchanged."""

from __future__ import annotations

import torch

import fxpass as fp
from fxpass.verify.inputs import sample_inputs_from_meta
from fxpass.verify.testing import Captured, check_pass

from _models import count, exported_gm

aten = torch.ops.aten


def _numbers_in_tensor_args(gm) -> int:
    total = 0
    for n in gm.graph.nodes:
        if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload):
            for arg, value in zip(n.target._schema.arguments, n.args):
                total += str(arg.type) == "Tensor" and isinstance(value, (int, float, bool))
    return total


def test_exported_llama_keeps_its_numerics_and_loses_every_scalar_operand():
    gm = exported_gm(layers=1, remove_asserts=True)
    assert _numbers_in_tensor_args(gm) > 0 and count(gm, aten.pow.Tensor_Scalar) == 3
    check = check_pass("scalar_to_tensor", Captured(gm, sample_inputs_from_meta(gm), "export"))
    out = check.graph_module
    assert _numbers_in_tensor_args(out) == 0
    assert count(out, aten.pow.Tensor_Scalar) == 0 and count(out, aten.pow.Tensor_Tensor) == 3
    stats = check.report.root.children[0].stats
    assert stats["scalars_converted"] == count(out, aten.scalar_tensor.default) - 2
    assert check.comparison.max_abs_error == 0


def test_without_switching_overloads_scalar_overloads_stay():
    gm = exported_gm(layers=1, remove_asserts=True)
    fp.Pipeline.parse("scalar_to_tensor{switch_overloads=false}").run(gm)
    assert count(gm, aten.pow.Tensor_Scalar) == 3 and _numbers_in_tensor_args(gm) == 0


def test_bf16_operands_keep_float32_scalars():
    class M(torch.nn.Module):
        def forward(self, x):
            return (x * 0.1 + 1e-6,)

    x = torch.randn(8, dtype=torch.bfloat16)
    ep = torch.export.export(M(), (x,)).run_decompositions()
    check = check_pass("scalar_to_tensor", Captured(ep.graph_module, [x], "export"))
    scalars = [n for n in check.graph_module.graph.nodes if n.target is aten.scalar_tensor.default]
    assert {n.kwargs["dtype"] for n in scalars} == {torch.float32}
    assert check.comparison.max_abs_error == 0
    assert all(n.meta["val"].dtype == torch.float32 for n in scalars)


def test_tensor_overload_sees_overloads_a_library_defines_later():
    from fxpass.passes.repair.scalar_to_tensor import _tensor_overload

    assert _tensor_overload(aten.add.Scalar) is aten.add.Tensor
    assert _tensor_overload(aten.pow.Tensor_Scalar) is aten.pow.Tensor_Tensor
    lib = torch.library.Library("fxpass_s2t_test", "DEF")
    lib.define("scale.Scalar(Tensor self, Scalar other) -> Tensor")
    op = torch.ops.fxpass_s2t_test.scale.Scalar
    assert _tensor_overload(op) is None
    lib.define("scale.Tensor(Tensor self, Tensor other) -> Tensor")
    assert _tensor_overload(op) is torch.ops.fxpass_s2t_test.scale.Tensor
