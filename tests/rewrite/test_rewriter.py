"""The rewriter: nothing half-done when a replacement fails, values moved behind inner
outputs, cycles refused, provenance and values on every new node."""

from __future__ import annotations

import pytest
import torch

import fxpass as fp
from fxpass.rewrite import P, ReplacementTypeError, RewriteError, Rule, rewrite, rules
from fxpass.rewrite import order as order_module
from fxpass.rewrite.order import TopoOrder, find_cycle

from _models import exported

aten = torch.ops.aten
x = P.var("x")


def test_a_failing_replacement_leaves_the_graph_as_it_was():
    ep = exported()
    before = ep.graph_module.code

    def boom(x):
        torch.ops.aten.neg.default(x)  # adds a node, then fails
        raise ValueError("no")

    with pytest.raises(RewriteError, match="the replacement raised ValueError: no") as info:
        rewrite(ep.graph_module, [Rule(P(aten.rsqrt.default, x), boom)])
    assert "test_rewriter.py" in str(info.value)
    ep.graph_module.recompile()
    assert ep.graph_module.code == before


def test_bad_return_values_are_errors():
    gm = torch.fx.symbolic_trace(lambda a: torch.relu(a) * 2)
    with pytest.raises(ReplacementTypeError, match="must return graph values") as info:
        rewrite(gm, [Rule(P(torch.relu, x), lambda x: 3.0)])
    assert isinstance(info.value, TypeError)  # as Inductor's pattern matcher fails there
    with pytest.raises(RewriteError, match="returned 2 value"):
        rewrite(gm, [Rule(P(torch.relu, x), lambda x: (x, x))])


def test_inner_output_read_before_the_root_moves_behind_the_replacement():
    def f(a, b):
        s = torch.add(a, b)
        early = torch.sigmoid(s)  # reads the inner output before the root
        r = torch.mul(torch.relu(s), 3)
        return r, early

    gm = torch.fx.symbolic_trace(f)
    s = P(torch.add, x, P.var("y")).named("s")
    rule = Rule(
        P(torch.mul, P(torch.relu, s), 3),
        lambda x, y: (torch.relu(torch.add(x, y)) * 3.0, torch.add(y, x)),
        outputs=["s"],
    )
    assert rewrite(gm, [rule]).rewrites == 1
    gm.graph.lint()  # topologically valid: sigmoid now follows the new add
    gm.recompile()
    a, b = torch.randn(4), torch.randn(4)
    for got, want in zip(gm(a, b), f(a, b)):
        torch.testing.assert_close(got, want)


def test_cycle_check_looks_only_inside_the_region_window(monkeypatch):
    def f(a):
        s = torch.add(a, 1)
        t = torch.sigmoid(s)
        u = torch.mul(s, torch.add(t, 2))
        for _ in range(50):  # a long tail after the region
            u = torch.relu(u)
        return u

    gm = torch.fx.symbolic_trace(f)
    order = TopoOrder(gm.graph)
    nodes = {n.name: n for n in gm.graph.nodes}
    bad = {nodes["add"], nodes["mul"], nodes["add_1"]}
    visited = []

    def counting(n):
        visited.append(n)
        return n._sort_key

    assert find_cycle(order, bad) is nodes["sigmoid"]
    good = {nodes["add_1"], nodes["mul"]}
    assert find_cycle(order, good) is None
    monkeypatch.setattr(order_module, "sort_key", counting)  # count position lookups
    find_cycle(order, good)
    assert len(visited) < 10  # the relu tail is never looked at


def test_rewriting_keeps_graph_order_positions():
    gm = torch.fx.symbolic_trace(lambda a: torch.neg(torch.neg(torch.relu(a))))
    rewrite(gm, [Rule(P(torch.neg, P(torch.neg, x)), lambda x: torch.sigmoid(x))])
    order = TopoOrder(gm.graph)
    keys = [order[n] for n in gm.graph.nodes]
    assert keys == sorted(keys)


def test_a_replacement_may_read_shapes():
    """``x.shape[-1]`` makes its getattr node on first use: it must come before its reader."""
    ep = torch.export.export(torch.nn.ReLU(), (torch.randn(2, 8),))
    scale = Rule(
        P(aten.relu.default, P.node("x")),
        lambda x: aten.mul.Tensor(aten.relu.default(x), torch.ones(x.shape[-1])),
    )
    assert rewrite(ep.graph_module, [scale], once=True).rewrites == 1
    ep.graph_module.graph.lint()
    x = torch.randn(2, 8)
    torch.testing.assert_close(ep.graph_module(x)[0], x.relu())


# ----- constants stay constants -------------------------------------------------------------
class _TimesFour(torch.nn.Module):
    def forward(self, v):
        return torch.neg(torch.mul(v, torch.tensor(4.0)))


def _no_tensor_literals(gm):
    for n in gm.graph.nodes:
        flat = torch.utils._pytree.tree_leaves((n.args, n.kwargs))
        assert not any(isinstance(a, torch.Tensor) for a in flat), n.format_node()


def _sub_twice(x, y):
    return torch.sub(x, y * torch.tensor(2.0))


def test_a_bound_constant_and_the_replacements_own_reach_the_graph_as_values():
    gm = torch.fx.symbolic_trace(_TimesFour())  # the constant: get_attr _tensor_constant0
    seen = []

    def replace(x, y, match):
        seen.append(match.bindings["y"])
        return _sub_twice(x, y)

    rule = Rule(P(torch.mul, x, P.var("y")), replace)
    assert rewrite(gm, [rule]).rewrites == 1
    assert seen[0].op == "get_attr"  # the bound constant is its node, not its tensor
    _no_tensor_literals(gm)
    gm.recompile()
    v = torch.randn(5)
    torch.testing.assert_close(gm(v), torch.neg(v - 4.0 * 2.0))
    made = [n for n in gm.graph.nodes if n.op == "get_attr" and n.users]
    assert len(made) == 2 and "val" in made[-1].meta


def test_the_replacements_constants_on_an_exported_program_become_lifted_constants():
    ep = torch.export.export(_TimesFour(), (torch.randn(5),))
    rule = Rule(
        P(aten.mul.Tensor, x, P.var("y")), lambda x, y: aten.sub.Tensor(x, y * torch.tensor(2.0))
    )
    out = fp.apply(ep, rules("constants", [rule])).program
    kinds = [s.kind.name for s in out.graph_signature.input_specs]
    assert kinds.count("CONSTANT_TENSOR") == 2  # the program's 4.0 and the replacement's 2.0
    v = torch.randn(5)
    torch.testing.assert_close(out.module()(v), torch.neg(v - 4.0 * 2.0))


def test_a_lifted_constant_bound_in_the_graph_module_of_an_export():
    ep = torch.export.export(_TimesFour(), (torch.randn(5),)).run_decompositions()
    rule = Rule(P(aten.mul.Tensor, x, P.var("y")), lambda x, y: aten.sub.Tensor(x, y))
    assert rewrite(ep.graph_module, [rule]).rewrites == 1
    _no_tensor_literals(ep.graph_module)
    ep.graph_module.recompile()
    v = torch.randn(5)
    torch.testing.assert_close(ep.module()(v), torch.neg(v - 4.0))


def test_a_fake_tensor_in_a_replacement_is_a_clear_error():
    gm = torch.fx.symbolic_trace(_TimesFour())
    before = gm.code
    fake = torch._subclasses.fake_tensor.FakeTensorMode().from_tensor(torch.ones(()))
    rule = Rule(P(torch.mul, x, P.var("y")), lambda x, y: torch.sub(x, fake))
    with pytest.raises(RewriteError, match="fake tensor as an argument; pass the graph value"):
        rewrite(gm, [rule])
    gm.recompile()
    assert gm.code == before
