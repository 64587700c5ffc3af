"""Every library pass on ExecuTorch Edge programs, as on ATen ones.

Each pass of the library (cleanup, repair, fusion, functional; found in the registry by
tests/passes/_library.py, so a new pass is covered when it lands) runs on real ``to_edge`` programs of the embedded decoder
and convnet, and on an Edge program that gives each pass something to do — through
ExecuTorch's own ``EdgeProgramManager.transform([pass])`` (its Edge verifier checks the
result) and through ``fxpass.apply(edge_program, pass)``. Outputs equal the original's; the
fusions find on the Edge program the sites they find on the ATen one.
"""

from __future__ import annotations

import copy
import functools

import _edge  # skips these tests where executorch is not installed
import pytest
import torch
from _edge import edge_manager, edge_program, example_inputs
from _library import library_passes
from executorch.exir import EdgeCompileConfig, EdgeProgramManager, to_edge
from torch import nn

import fxpass as fp
from fxpass.fxutil.dialect import edge_op, is_edge_op
from fxpass.fxutil.values import fake_value

from _models import lifted_inputs

aten = torch.ops.aten
F = torch.ops.fxpass
PASSES = library_passes()


# ----- an Edge program with work for every cleanup and repair pass -----------------------
class _Busy(nn.Module):
    """No-op clone and view, a detach (Edge: alias_copy), a repeated sin, a copy into a new
    buffer, a scalar multiply, and the input returned as an output."""

    def forward(self, x):
        a = x.clone().view(x.shape).detach()
        e = a.sin() + a.sin()
        buf = torch.zeros_like(x)
        buf.copy_(e)
        return x, (buf * 0.5).relu()


@functools.cache
def _busy_manager() -> EdgeProgramManager:
    args = (torch.randn(2, 8),)
    ep = torch.export.export(_Busy(), args)
    return to_edge(ep, compile_config=EdgeCompileConfig(_check_ir_validity=True))


def _plant(ep: torch.export.ExportedProgram, *, inplace: bool = False) -> None:
    """Add what to_edge leaves out of its programs, in Edge ops: an unused sin (dce), a
    detach_copy (remove_detach), an _assert_async (remove_assert_ops), a mul.Scalar
    (scalar_to_tensor); with ``inplace``, a relu_ on a fresh value (inplace_to_functional;
    ExecuTorch's verifier rejects it, so only that pass's program has one)."""
    graph = ep.graph_module.graph
    relu = next(n for n in graph.nodes if n.op == "call_function" and "relu" in str(n.target))
    src = relu.args[0]
    with graph.inserting_before(relu):
        dead = _call(graph, aten.sin.default, src)
        detached = _call(graph, aten.detach_copy.default, src)
        flag = _call(graph, aten.scalar_tensor.default, 1.0, like=src)
        check = graph.call_function(edge_op(aten._assert_async.msg), (flag, "planted"))
        check.meta["val"] = None
        out = _call(graph, aten.mul.Scalar, detached, 1.0)
        if inplace:
            out = _call(graph, aten.relu_.default, _call(graph, aten.neg.default, out))
            out = _call(graph, aten.neg.default, out)
    assert not dead.users
    relu.replace_input_with(src, out)
    ep.graph_module.recompile()


def _call(graph: torch.fx.Graph, op, *args, like=None) -> torch.fx.Node:
    node = graph.call_function(edge_op(op), args)
    node.meta["val"] = fake_value(op, args, {}, like=like.meta["val"] if like else None)
    return node


def _busy(inplace: bool = False) -> tuple[torch.export.ExportedProgram, tuple]:
    ep = copy.deepcopy(_busy_manager()).exported_program()
    _plant(ep, inplace=inplace)
    return ep, (torch.randn(2, 8, generator=torch.Generator().manual_seed(0)),)


#: passes that must change the busy program (fusions and fix_functionalization have no site);
#: a new pass that finds work in it is named here (docs/architecture.md, "Adding a pass")
_BUSY_CHANGES = {
    "cse", "dce", "erase_copy", "inplace_to_functional", "remove_assert_ops", "remove_detach",
    "remove_noop", "repair_input_as_output", "scalar_to_tensor",
}  # fmt: skip


def _outputs(ep: torch.export.ExportedProgram, args: tuple) -> list[torch.Tensor]:
    """The program's user outputs, its graph run directly (``ep.module()`` costs more)."""
    ep.graph_module.recompile()
    with torch.no_grad():
        flat = ep.graph_module(*lifted_inputs(ep), *[a.clone() for a in args])
    return list(flat)[-len(ep.graph_signature.user_outputs) :]


def _assert_same(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5)


@functools.cache
def _expected(program: str, inplace: bool) -> list[torch.Tensor]:
    ep, args = _program(program, "inplace_to_functional" if inplace else "")
    return _outputs(ep, args)


def _program(name: str, pass_name: str) -> tuple[torch.export.ExportedProgram, tuple]:
    if name == "busy":
        return _busy(inplace=pass_name == "inplace_to_functional")
    return edge_program(name), example_inputs(name)


@pytest.mark.parametrize("program", ["llama", "convnet", "busy"])
@pytest.mark.parametrize("name", PASSES)
def test_pass_through_fxpass_apply(name, program):
    ep, args = _program(program, name)
    expected = _expected(program, name == "inplace_to_functional")
    result = fp.apply(ep, name, sample_inputs=args)
    _assert_same(_outputs(result.program, args), expected)
    if program == "busy":
        assert result.modified is (name in _BUSY_CHANGES), name
    before = {n.target for n in ep.graph.nodes}
    for n in result.program.graph.nodes:  # what a pass adds to an Edge graph is Edge
        if n.op == "call_function" and n.target not in before:
            assert is_edge_op(n.target) or not isinstance(n.target, torch._ops.OpOverload), n


@pytest.mark.parametrize("name", PASSES)
def test_pass_through_edge_manager_transform(name):
    """ExecuTorch's own entry point; its Edge verifier checks every op of the result."""
    if name == "repair_input_as_output":
        pytest.skip("takes sample inputs: (gm, sample_inputs) passes run through fxpass.apply")
    manager = copy.deepcopy(_busy_manager())
    _plant(manager.exported_program())
    args = (torch.randn(2, 8),)
    expected = _outputs(manager.exported_program(), args)
    out = manager.transform([fp.Pipeline([name])])
    _assert_same(_outputs(out.exported_program(), args), expected)


FUSED = {"fuse_add_rmsnorm": F.fused_add_rmsnorm.default, "fuse_rmsnorm": F.rms_norm.default}


def _fused_sites(gm: torch.fx.GraphModule) -> dict[str, int]:
    count = dict.fromkeys(FUSED, 0)
    for n in gm.graph.nodes:
        for name, op in FUSED.items():
            if n.op == "call_function" and (n.target is op or getattr(n.target, "_op", None) is op):
                count[name] += 1
    return count


def test_default_pipeline_fuses_the_same_sites_as_on_aten():
    ep = edge_program("llama")
    args = example_inputs("llama")
    expected = _outputs(ep, args)
    result = fp.apply(ep, "default")
    stats = result.report.stats()
    assert stats["fuse_add_rmsnorm.rewrites"] == 4 and stats["fuse_rmsnorm.rewrites"] == 1
    aten_ep = torch.export.export(_edge.module("llama"), args)  # the same float32 model
    aten_result = fp.apply(aten_ep, "default")
    assert _fused_sites(result.program.graph_module) == _fused_sites(aten_result.graph_module)
    _assert_same(_outputs(result.program, args), expected)
    fused = [n for n in result.program.graph.nodes if "fused_add_rmsnorm" in str(n.target)]
    assert all(is_edge_op(n.target) for n in fused)  # ExecuTorch's verifier asks for Edge ops


def test_fusions_inside_executorch_transform():
    manager = edge_manager("llama")
    args = example_inputs("llama")
    expected = _outputs(manager.exported_program(), args)
    out = manager.transform([fp.Pipeline(["fuse_add_rmsnorm", "fuse_rmsnorm"])])
    assert _fused_sites(out.exported_program().graph_module) == {
        "fuse_add_rmsnorm": 4,
        "fuse_rmsnorm": 1,
    }
    _assert_same(_outputs(out.exported_program(), args), expected)
