"""Traced patterns: ordinary PyTorch functions traced into each IR, scalars captured."""

from __future__ import annotations

import pytest
import torch

import fxpass.ops  # noqa: F401
from fxpass.rewrite import TraceError, explain, rewrite, trace, traced_rule

from _models import decoder, exported

F = torch.ops.fxpass


def pattern(x, residual, weight, eps):
    s = x + residual
    h = s.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(s.dtype), s


def replacement(x, residual, weight, eps):
    out = torch.ops.fxpass.fused_add_rmsnorm(x, residual, weight, eps)
    return out[0], out[1]


def _examples():
    bf = torch.bfloat16
    return (
        torch.randn(2, 8, dtype=bf),
        torch.randn(2, 8, dtype=bf),
        torch.randn(8, dtype=bf),
        1e-6,
    )


@pytest.mark.parametrize("eps", [1e-6, 1e-5])
def test_core_aten_rule_fuses_every_add_norm_with_its_eps(eps):
    rule = traced_rule(pattern, replacement, _examples(), ir="aten")
    assert rule.outputs == ("output1",) and "test_traced.py" in rule.location
    ep = exported(eps=eps)  # asserts still in: they hang off the norm and go with it
    (ids,) = decoder(eps=eps).example_inputs()
    expected = ep.module()(ids)
    result = rewrite(ep.graph_module, [rule])
    assert result.rewrites == 4
    fused = [n for n in ep.graph_module.graph.nodes if n.target is F.fused_add_rmsnorm.default]
    assert {n.args[3] for n in fused} == {eps}  # captured, not assumed
    torch.testing.assert_close(ep.module()(ids), expected, rtol=3e-2, atol=3e-2)


def test_patterns_only_match_their_own_dialect():
    dynamo_rule = traced_rule(pattern, replacement, _examples(), ir="dynamo")
    why = explain(dynamo_rule, exported().graph_module)
    assert not why.matches and "no node calls its root op" in str(why)


@pytest.mark.parametrize("ir", ["aot", "dynamo"])
def test_compiled_graph_rules(ir):
    graphs = []

    def keep(gm, example_inputs):
        graphs.append((gm, list(example_inputs)))
        return gm.forward

    model = decoder()
    (ids,) = model.example_inputs()
    torch._dynamo.reset()
    with torch.no_grad():
        if ir == "dynamo":
            torch.compile(model, backend=keep, fullgraph=True)(ids)
            gm, args = graphs[0]
        else:
            from torch._dynamo.backends.common import aot_autograd

            real = []

            def outer(g, ex):
                real.append(list(ex))
                return aot_autograd(fw_compiler=keep)(g, ex)

            torch.compile(model, backend=outer, fullgraph=True)(ids)
            gm, args = graphs[0][0], real[0]
    torch._dynamo.reset()
    expected = gm(*args)
    rule = traced_rule(pattern, replacement, _examples(), ir=ir)
    assert rewrite(gm, [rule]).rewrites == 4
    gm.recompile()
    got = gm(*args)
    got, expected = (got[0], expected[0]) if isinstance(got, (tuple, list)) else (got, expected)
    torch.testing.assert_close(got, expected, rtol=3e-2, atol=3e-2)


def test_symbolic_trace_rule():
    def f(a, b):
        return torch.relu(a + b) * 2

    rule = traced_rule(
        lambda x, y: torch.relu(x + y),
        lambda x, y: torch.clamp(x + y, min=0),
        (torch.ones(2), torch.ones(2)),
        ir="fx",
    )
    gm = torch.fx.symbolic_trace(f)
    assert rewrite(gm, [rule]).rewrites == 1
    gm.recompile()
    v = torch.randn(4)
    torch.testing.assert_close(gm(v, v), f(v, v))


def test_untraced_replacement_is_called_per_match():
    rule = traced_rule(
        pattern,
        lambda x, residual, weight, eps: replacement(x, residual, weight, eps),
        _examples(),
        trace_replacement=False,
    )
    ep = exported()
    assert rewrite(ep.graph_module, [rule]).rewrites == 4


def test_scalars_that_do_not_reach_an_op_are_an_error():
    def scaled(x, eps):
        return x * (eps * 2)

    with pytest.raises(TraceError, match="scalar parameter\\(s\\) eps"):
        traced_rule(scaled, scaled, (torch.ones(3), 0.5), ir="fx")


def test_trace_errors_name_the_problem():
    with pytest.raises(TraceError, match="takes 2 parameters"):
        trace(lambda a, b: a + b, (torch.ones(1),), "aten")
    with pytest.raises(ValueError, match="ir must be one of"):
        trace(lambda a: a, (torch.ones(1),), "onnx")
    with pytest.raises(TraceError, match="plain positional parameters"):
        trace(lambda *a: a[0] + 1, (torch.ones(1),), "aten")
    with pytest.raises(TraceError, match="replacement's parameters"):
        traced_rule(lambda a: a + 1, lambda b: b + 1, (torch.ones(1),), ir="fx")


class _TimesFour(torch.nn.Module):
    def forward(self, v):
        return torch.neg(torch.mul(v, torch.tensor(4.0)))


def _times(x, y):
    return torch.mul(x, y)


def _minus_twice(x, y):
    return torch.sub(x, y + torch.tensor(2.0))  # a constant of the replacement's own


@pytest.mark.parametrize("ir", ["fx", "aten", "export"])
def test_a_traced_replacements_constant_is_its_own(ir):
    rule = traced_rule(_times, _minus_twice, (torch.randn(5), torch.randn(())), ir=ir)
    if ir == "fx":  # the program's constant has the name the replacement's had when traced
        gm = torch.fx.symbolic_trace(_TimesFour())
        run = gm
    else:
        ep = torch.export.export(_TimesFour(), (torch.randn(5),))
        ep = ep.run_decompositions() if ir == "aten" else ep
        gm, run = ep.graph_module, ep.module
    assert rewrite(gm, [rule]).rewrites == 1
    gm.recompile()
    v = torch.randn(5)
    out = run(v) if ir == "fx" else run()(v)
    torch.testing.assert_close(out, torch.neg(v - (4.0 + 2.0)))


@pytest.mark.parametrize("ir", ["fx", "aten"])
def test_a_traced_pattern_with_a_constant_is_a_clear_error(ir):
    def pattern(x):
        return torch.mul(x, torch.tensor(4.0))

    with pytest.raises(TraceError, match="cannot contain get_attr nodes.*pass tensors as param"):
        traced_rule(pattern, pattern, (torch.randn(5),), ir=ir)
