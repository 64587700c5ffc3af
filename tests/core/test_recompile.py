"""No wasted recompiles: fxpass.apply and pipeline runs generate no code; the result generates
it once, when it is first run, printed or saved; rollback and numerics checks still hold."""

from __future__ import annotations

import pytest
import torch
from torch import fx

import fxpass as fp
from fxpass.fxutil.fx import is_lazy_module
from fxpass.verify.numerics import NumericsCheck

from _models import lifted_inputs

aten = torch.ops.aten


@pytest.fixture
def codegen(monkeypatch):
    """How often torch generated a graph's Python code (Graph.python_code calls), with
    torch's structured log off: pytest's log capture hangs its handlers on every logger that
    does not propagate, torch's trace log too, which turns tracing on (a trace writes the
    graphs, as code, on purpose)."""
    monkeypatch.setattr(fp.targets.runner, "tracing", lambda: False)
    calls = []
    real = fx.Graph.python_code

    def counting(self, *args, **kwargs):
        calls.append(self)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(fx.Graph, "python_code", counting)
    return calls


def _nodes(gm, target):
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target is target]


def drop_asserts(gm):
    for n in _nodes(gm, aten._assert_tensor_metadata.default):
        gm.graph.erase_node(n)
    gm.recompile()


def scale_rsqrt(factor):
    def scale(gm):
        """rsqrt(x) -> rsqrt(x) * factor."""
        for n in _nodes(gm, aten.rsqrt.default):
            with gm.graph.inserting_after(n):
                mul = gm.graph.call_function(aten.mul.Tensor, (n, factor))
            n.replace_all_uses_with(mul, delete_user_cb=lambda u, mul=mul: u is not mul)
        gm.recompile()

    scale.__name__ = f"scale_rsqrt_{factor}"
    return scale


def test_apply_to_a_program_generates_no_code_until_it_runs(llama_ep, codegen):
    inputs = llama_ep.example_inputs[0]
    expected = llama_ep.module()(*inputs)
    codegen.clear()
    result = fp.apply(llama_ep, "default")
    assert result.modified
    assert codegen == []  # not the copy, not the passes, not the rebuilt program
    gm = result.program.graph_module
    assert is_lazy_module(gm)
    with torch.no_grad():
        flat = gm(*lifted_inputs(result.program), *inputs)
        assert len(codegen) == 1  # generated once, by the call
        gm(*lifted_inputs(result.program), *inputs)
    assert len(codegen) == 1
    torch.testing.assert_close(flat[-1], result.program.module()(*inputs), rtol=0, atol=0)
    torch.testing.assert_close(flat[-1], expected, rtol=2e-2, atol=2e-2)  # bf16 norms fused


def test_a_transformed_program_saves_and_loads(llama_ep, tmp_path, codegen):
    inputs = llama_ep.example_inputs[0]
    expected = llama_ep.module()(*inputs)
    program = fp.apply(llama_ep, "default").program
    codegen.clear()
    path = fp.targets.export.save(program, tmp_path / "lazy.pt2")
    assert len(codegen) == 1  # torch's serializer prints the graph once; nothing else
    loaded = fp.targets.export.load(path)
    got = loaded.module()(*inputs)
    torch.testing.assert_close(got, program.module()(*inputs), rtol=0, atol=0)
    torch.testing.assert_close(got, expected, rtol=2e-2, atol=2e-2)
    assert "_assert_tensor_metadata" not in program.graph_module.code


def test_a_changed_graph_module_comes_back_lazy(llama_ep, codegen):
    class Tagged(fx.GraphModule):
        def tag(self):
            return "tagged"

    gm = Tagged(llama_ep.graph_module, llama_ep.graph_module.graph)
    args = (*lifted_inputs(llama_ep), *llama_ep.example_inputs[0])
    expected = gm(*args)[-1] * 1.0
    codegen.clear()
    result = fp.Pipeline([drop_asserts, scale_rsqrt(1.0)]).run(gm)
    assert result.modified and result.graph_module is gm
    assert codegen == []
    assert is_lazy_module(gm) and isinstance(gm, Tagged) and gm.tag() == "tagged"
    torch.testing.assert_close(gm(*args)[-1], expected)
    assert len(codegen) == 1
    assert "_assert_tensor_metadata" not in gm.code and "rsqrt" in str(gm)
    assert len(codegen) == 1


def test_an_unchanged_run_leaves_the_module_alone(llama_gm, codegen):
    cls = type(llama_gm)
    assert not fp.Pipeline([lambda gm: False]).run(llama_gm).modified
    assert type(llama_gm) is cls and codegen == []


def test_a_pass_that_runs_the_module_gets_fresh_code_and_a_rollback_restores_it(llama_ep):
    gm = llama_ep.graph_module
    args = (*lifted_inputs(llama_ep), *llama_ep.example_inputs[0])
    cls, code = type(gm), gm.code
    seen = {}

    def runs_it(gm):
        seen["out"] = gm(*args)[-1]  # mid-run: the code of the changed graph, generated now
        return False

    def boom(gm):
        raise RuntimeError("late failure")

    with pytest.raises(fp.PassFailedError):
        fp.Pipeline([drop_asserts, scale_rsqrt(2.0), runs_it, boom]).run(gm)
    assert "out" in seen
    assert type(gm) is cls and gm.code == code  # the run rolled back: class and code as they were
    assert any(n.target is aten._assert_tensor_metadata.default for n in gm.graph.nodes)


def test_numerics_are_checked_on_the_graph_not_on_stale_code(llama_gm):
    check = NumericsCheck()
    fp.Pipeline([drop_asserts, scale_rsqrt(2.0)]).run(llama_gm, instrument=[check])
    assert check.first_divergence is not None
    assert check.first_divergence.name == "scale_rsqrt_2.0"
