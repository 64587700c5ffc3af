"""fix_functionalization: functionalized in-place ops go back in place where nobody can tell."""

from __future__ import annotations

import operator

import pytest
import torch
from torch._dynamo.backends.common import aot_autograd

import fxpass as fp
from fxpass.verify import keeps_metadata
from fxpass.verify.compare import compare_outputs
from fxpass.verify.numerics import run_graph

OPS = torch.ops.fxpass
AF2 = torch.ops.higher_order.auto_functionalized_v2
AF1 = torch.ops.higher_order.auto_functionalized


@torch.library.custom_op("fxpass_test::scale_", mutates_args=("x",))
def _scale_(x: torch.Tensor, s: float) -> None:
    x.mul_(s)


@_scale_.register_fake
def _(x, s):
    return None


@torch.library.custom_op("fxpass_test::add_into_", mutates_args=("out",))
def _add_into_(out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    out.add_(x)
    return x.sum()


@_add_into_.register_fake
def _(out, x):
    return x.new_empty(())


def _count(gm, target) -> int:
    return sum(1 for n in gm.graph.nodes if n.target is target)


class _FusedInPlace(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(1 + 0.1 * torch.randn(16))

    def forward(self, x, r):
        x, r = x * 2, r + 1
        OPS.fused_add_rmsnorm_(x, r, self.w, 1e-6)
        return x.relu(), r


class _UserOps(torch.nn.Module):
    def forward(self, x):
        a = x * 2
        torch.ops.fxpass_test.scale_(a, 3.0)
        b = x + 1
        total = torch.ops.fxpass_test.add_into_(b, a)
        return a, b, total


class _SliceInPlace(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(8))

    def forward(self, x, r):
        x, r = x * 2, r + 1
        OPS.fused_add_rmsnorm_(x[:, :8], r[:, :8], self.w, 1e-6)
        return x, r


def _export(model, *inputs):
    ep = torch.export.export(model, inputs).run_decompositions()
    params = [p.detach() for p in model.parameters()]
    return ep.graph_module, [*params, *inputs]


@pytest.mark.parametrize(
    "model, inputs, op",
    [
        (_FusedInPlace(), (torch.randn(2, 4, 16), torch.randn(2, 4, 16)), OPS.fused_add_rmsnorm_),
        (_UserOps(), (torch.randn(3, 5),), torch.ops.fxpass_test.scale_),
        (_SliceInPlace(), (torch.randn(4, 16), torch.randn(4, 16)), OPS.fused_add_rmsnorm_),
    ],
    ids=["fxpass-op", "user-ops", "slice-views"],
)
def test_exported_calls_go_back_in_place(model, inputs, op):
    gm, flat = _export(model, *inputs)
    calls = _count(gm, AF2)
    assert calls >= 1
    expected = run_graph(gm, flat)
    pipe = fp.Pipeline.parse("fix_functionalization").add_checks(keeps_metadata())
    result = pipe.run(gm)
    assert _count(gm, AF2) == 0 and _count(gm, op.default) == 1
    assert result.report.root.children[0].stats == {"reinplaced": calls}
    assert compare_outputs(expected, run_graph(gm, flat)).ok


def _aot_graph(model, inputs, *, keep_input_mutations):
    graphs = []

    def compiler(gm, example_inputs):
        graphs.append(gm)
        return gm

    backend = aot_autograd(
        fw_compiler=compiler, keep_inference_input_mutations=keep_input_mutations
    )
    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, backend=backend, fullgraph=True)(*[t.clone() for t in inputs])
    torch._dynamo.reset()
    return graphs[0]


class _MutatesInputs(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(16))

    def forward(self, x, r):
        OPS.fused_add_rmsnorm_(x, r, self.w, 1e-6)
        return (x.sum(),)


def test_write_backs_into_inputs_become_the_in_place_write():
    model = _MutatesInputs()
    inputs = (torch.randn(4, 16), torch.randn(4, 16))
    gm = _aot_graph(model, inputs, keep_input_mutations=True)
    assert _count(gm, torch.ops.aten.copy_.default) == 2
    flat = [model.w.detach(), *inputs]
    before = [t.clone() for t in flat]
    expected = run_graph(gm, before)
    result = fp.Pipeline.parse("fix_functionalization").run(gm)
    after = [t.clone() for t in flat]
    got = run_graph(gm, after)
    assert _count(gm, AF2) == 0 and _count(gm, torch.ops.aten.copy_.default) == 0
    assert result.report.root.children[0].stats == {"reinplaced": 1, "copies_removed": 2}
    assert compare_outputs(expected, got).ok
    assert all(torch.equal(a, b) for a, b in zip(before, after))  # inputs mutated alike


def test_inputs_returned_as_new_values_are_not_written_in_place():
    # without write-backs the caller copies the returned values; an in-place write would
    # change the caller's tensors behind its back
    model = _MutatesInputs()
    gm = _aot_graph(model, (torch.randn(4, 16), torch.randn(4, 16)), keep_input_mutations=False)
    result = fp.Pipeline.parse("fix_functionalization").run(gm)
    assert result.modified is False and _count(gm, AF2) == 1


class _MutatesBuffer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("state", torch.zeros(4, 16))

    def forward(self, x):
        torch.ops.fxpass_test.scale_(self.state, 0.5)
        return (x + self.state,)


def test_buffer_mutations_of_an_exported_program_stay_functional():
    gm, _ = _export(_MutatesBuffer(), torch.randn(4, 16))
    result = fp.Pipeline.parse("fix_functionalization").run(gm)
    assert result.modified is False and _count(gm, AF2) == 1


def test_a_base_read_after_the_call_keeps_it_functional():
    gm, _ = _export(_FusedInPlace(), torch.randn(2, 4, 16), torch.randn(2, 4, 16))
    graph = gm.graph
    call = next(n for n in graph.nodes if n.target is AF2)
    base = call.kwargs["_all_bases"][0]
    with graph.inserting_after(call):  # a reader of the old value after the call
        old_sum = graph.call_function(torch.ops.aten.sum.default, (base,))
    out = graph.output_node()
    out.args = ((*out.args[0], old_sum),)
    gm.recompile()
    result = fp.Pipeline.parse("fix_functionalization").run(gm)
    assert result.modified is False and _count(gm, AF2) == 1


def test_auto_functionalized_v1_goes_back_in_place_too():
    from torch._higher_order_ops.auto_functionalize import auto_functionalized

    def f(x):
        a = x * 2
        torch.ops.fxpass_test.scale_(a, 3.0)
        return (a + 1,)

    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(f, tracing_mode="fake")(torch.randn(4))
    graph = gm.graph  # write the v1 form by hand, as older functionalization emits it
    call = next(n for n in graph.nodes if n.target is torch.ops.fxpass_test.scale_.default)
    with graph.inserting_before(call):
        af = graph.call_function(
            auto_functionalized,
            (torch.ops.fxpass_test.scale_.default,),
            {"x": call.args[0], "s": call.args[1]},
        )
        new_x = graph.call_function(operator.getitem, (af, 1))
    for user in list(call.args[0].users):
        if user is not af and user is not call:
            user.replace_input_with(call.args[0], new_x)
    graph.erase_node(call)
    gm.recompile()
    x = torch.randn(4)
    expected = gm(x)
    assert _count(gm, AF1) == 1
    result = fp.Pipeline.parse("fix_functionalization").run(gm)
    assert result.modified and _count(gm, AF1) == 0
    assert _count(gm, torch.ops.fxpass_test.scale_.default) == 1
    assert torch.equal(gm(x)[0], expected[0])
