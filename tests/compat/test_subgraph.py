"""fxpass.compat.fx's subgraph rewriter and matchers against torch's: same results, no crash
where torch's crashes, metadata on new nodes, and the debug counter respected."""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.fx import subgraph_rewriter as torch_rewriter
from torch.fx.passes.utils import matcher_utils as torch_matcher
from torch.fx.passes.utils.matcher_with_name_node_map_utils import (
    SubgraphMatcherWithNameNodeMap as TorchNameNodeMatcher,
)

import fxpass as fp
import fxpass.ops
from fxpass.compat import fx as cfx

from _models import exported_gm

aten = torch.ops.aten


def _names(mapping):
    return {k.name: (v.name if isinstance(v, torch.fx.Node) else v) for k, v in mapping.items()}


def _both(gm, *args, **kwargs):
    """Run torch's and our replace_pattern(_with_filters) on copies; return both results."""
    a, b = copy.deepcopy(gm), copy.deepcopy(gm)
    if kwargs or len(args) > 2:
        ra = torch_rewriter.replace_pattern_with_filters(a, *args, **kwargs)
        rb = cfx.replace_pattern_with_filters(b, *args, **kwargs)
        key = lambda r: (r.anchor.name, _names(r.nodes_map), [n.name for n in r.replacements])  # noqa: E731
    else:
        ra = torch_rewriter.replace_pattern(a, *args)
        rb = cfx.replace_pattern(b, *args)
        key = lambda r: (r.anchor.name, _names(r.nodes_map))  # noqa: E731
    assert [key(r) for r in ra] == [key(r) for r in rb]
    assert a.code == b.code
    return a, b, rb


class _CatSum(torch.nn.Module):
    def forward(self, x, w1, w2):
        m1 = torch.cat([w1, w2]).sum()
        m2 = torch.cat([w1, w2]).sum()
        return x + torch.max(m1) + torch.max(m2)


def test_docstring_example_same_as_torch():
    gm = torch.fx.symbolic_trace(_CatSum())
    _, ours, results = _both(
        gm, lambda w1, w2: torch.cat([w1, w2]), lambda w1, w2: torch.stack([w1, w2])
    )
    assert len(results) == 2
    assert all(isinstance(r, torch_rewriter.Match) for r in results)
    x, w = torch.randn(3), torch.randn(2, 3)
    torch.testing.assert_close(ours(x, w, w), _stacked(x, w))


def _stacked(x, w):
    m = torch.stack([w, w]).sum()
    return x + torch.max(m) + torch.max(m)


def test_overlapping_matches_resolved_as_torch_does():
    gm = torch.fx.symbolic_trace(lambda x: torch.relu(torch.relu(torch.relu(torch.relu(x)))))
    _both(gm, lambda x: torch.relu(torch.relu(x)), lambda x: torch.sigmoid(x))


def _norm_pattern(x, residual, weight):
    s = aten.add.Tensor(x, residual)
    h = aten._to_copy.default(s, dtype=torch.float32)
    v = aten.mean.dim(aten.pow.Tensor_Scalar(h, 2), [-1], True)
    n = aten.mul.Tensor(h, aten.rsqrt.default(aten.add.Tensor(v, 1e-6)))
    return aten.mul.Tensor(weight, aten._to_copy.default(n, dtype=torch.bfloat16)), s


def _norm_replacement(x, residual, weight):
    out = torch.ops.fxpass.fused_add_rmsnorm.default(x, residual, weight, 1e-6, 0.0)
    return out[0], out[1]


def test_llama_add_rmsnorm_same_as_torch_plus_metadata():
    gm = exported_gm(remove_asserts=True)
    theirs, ours, results = _both(gm, _norm_pattern, _norm_replacement)
    assert len(results) == 4  # two per layer
    fused = [n for n in ours.graph.nodes if n.target is torch.ops.fxpass.fused_add_rmsnorm.default]
    assert len(fused) == 4
    for n in ours.graph.nodes:
        if n.op == "call_function" and "fxpass_provenance" in n.meta:
            assert "val" in n.meta and n.meta["stack_trace"] and n.meta["nn_module_stack"]
            assert n.meta["from_node"] and n.meta["fxpass_provenance"]["rule"] == "replace_pattern"
    fused_op = torch.ops.fxpass.fused_add_rmsnorm.default
    torch_new = [n for n in theirs.graph.nodes if n.target is fused_op]
    assert torch_new and all("val" not in n.meta for n in torch_new)  # what torch leaves


def test_filters_callback_and_name_match_same_as_torch():
    gm = exported_gm(remove_asserts=True)
    first_only = lambda m, g, p: m.placeholder_nodes[0].name != "embedding"  # noqa: E731
    _both(gm, _norm_pattern, _norm_replacement, match_filters=[first_only])
    callback = lambda m, g, p: torch.fx.symbolic_trace(_norm_replacement).graph  # noqa: E731
    _both(gm, _norm_pattern, None, replacement_callback=callback)
    cat = torch.fx.symbolic_trace(_CatSum())
    _both(
        cat, lambda a, b: torch.cat([a, b]), lambda a, b: torch.stack([a, b]), node_name_match="cat"
    )


class _HalfRsqrt(torch.nn.Module):
    def forward(self, x, w):
        return aten.mul.Tensor(w, aten.rsqrt.default(aten.mul.Tensor(x, 0.5)))


def test_ignore_literals_does_not_crash_where_torch_does():
    gm = torch.fx.symbolic_trace(_HalfRsqrt())

    def pattern(w, x):
        return aten.mul.Tensor(w, aten.rsqrt.default(x))

    def replacement(w, x):
        return aten.div.Tensor(w, aten.sqrt.default(x))

    with pytest.raises(KeyError):
        torch_rewriter.replace_pattern_with_filters(
            copy.deepcopy(gm), pattern, replacement, ignore_literals=True
        )
    ours = copy.deepcopy(gm)
    done = cfx.replace_pattern_with_filters(ours, pattern, replacement, ignore_literals=True)
    assert len(done) == 1  # the outer mul; the inner mul(x, 0.5) is not an rsqrt
    x, w = torch.rand(4) + 0.1, torch.randn(4)
    torch.testing.assert_close(ours(x, w), gm(x, w))


def test_ignore_literals_matches_other_literals():
    gm = torch.fx.symbolic_trace(lambda x: torch.add(x, 3) * torch.add(x, 5))
    _, _, done = _both(
        gm, lambda x: torch.add(x, 1), lambda x: torch.sub(x, 1), ignore_literals=True
    )
    assert len(done) == 2


def _internal(matches):
    return [
        (
            [a.name for a in m.anchors],
            _names(m.nodes_map),
            [getattr(n, "name", n) for n in m.placeholder_nodes],
            [n.name for n in m.returning_nodes],
        )
        for m in matches
    ]


@pytest.mark.parametrize("match_output", [False, True])
@pytest.mark.parametrize("match_placeholder", [False, True])
@pytest.mark.parametrize("overlapping", [False, True])
def test_subgraph_matcher_options_same_as_torch(match_output, match_placeholder, overlapping):
    target = torch.fx.symbolic_trace(lambda x, y: torch.relu(torch.relu(x + y) + y)).graph
    pattern = torch.fx.symbolic_trace(lambda a, b: torch.relu(a + b)).graph
    opts = dict(
        match_output=match_output,
        match_placeholder=match_placeholder,
        remove_overlapping_matches=overlapping,
    )
    theirs = torch_matcher.SubgraphMatcher(pattern, **opts).match(target)
    ours = cfx.SubgraphMatcher(pattern, **opts).match(target)
    assert _internal(ours) == _internal(theirs)
    assert all(isinstance(m, torch_matcher.InternalMatch) for m in ours)


def test_multiple_anchors_same_as_torch():
    def target(x, y):
        a = torch.relu(x)
        return torch.sigmoid(a) + torch.tanh(a), torch.sigmoid(y) * torch.tanh(y)

    def pattern(x):
        a = torch.relu(x)
        return torch.sigmoid(a), torch.tanh(a)

    g = torch.fx.symbolic_trace(target).graph
    p = torch.fx.symbolic_trace(pattern).graph
    theirs = torch_matcher.SubgraphMatcher(p).match(g)
    ours = cfx.SubgraphMatcher(p).match(g)
    assert _internal(ours) == _internal(theirs) and len(ours) == 1


def test_matcher_rejects_what_torch_rejects():
    with pytest.raises(ValueError, match="empty pattern"):
        cfx.SubgraphMatcher(torch.fx.Graph())
    g = torch.fx.Graph()
    x = g.placeholder("x")
    g.call_function(torch.relu, (x,))
    g.output(x)
    with pytest.raises(AssertionError, match="dead code"):
        cfx.SubgraphMatcher(g)


def test_name_node_map_same_as_torch():
    def pattern(x, weight):
        conv = torch.nn.functional.conv2d(x, weight)
        relu = torch.nn.functional.relu(conv)
        return relu, {"conv": conv, "relu": relu}

    def target(x, weight):
        return torch.nn.functional.relu(torch.nn.functional.conv2d(x, weight)) * 2

    inputs = (torch.randn(1, 1, 3, 3), torch.randn(1, 1, 1, 1))
    graph = torch.export.export(_Fn(target), inputs).module().graph

    def make():
        return torch.export.export(_Fn(pattern), inputs).module()

    theirs = TorchNameNodeMatcher(make()).match(graph)
    ours = cfx.SubgraphMatcherWithNameNodeMap(make()).match(graph)
    assert len(ours) == len(theirs) == 1
    assert {k: v.name for k, v in ours[0].name_node_map.items()} == {
        k: v.name for k, v in theirs[0].name_node_map.items()
    }


class _Fn(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


class _WithConst(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("c", torch.ones(3))

    def forward(self, x):
        return torch.relu(x + self.c)


def test_get_attr_patterns_same_as_torch():
    gm = torch.fx.symbolic_trace(_WithConst())
    pattern = torch.fx.symbolic_trace(_WithConst())
    theirs = torch_matcher.SubgraphMatcher(pattern.graph).match(gm.graph)
    ours = cfx.SubgraphMatcher(pattern.graph).match(gm.graph)
    assert _internal(ours) == _internal(theirs) and len(ours) == 1


def test_debug_counter_and_instrumentation_see_each_replacement():
    gm = exported_gm(remove_asserts=True)
    seen = []

    class Spy(fp.core.Instrumentation):
        def on_change(self, event, ctx):
            seen.append(event.rule)

    def fuse(gm):
        return bool(cfx.replace_pattern(gm, _norm_pattern, _norm_replacement))

    fp.Pipeline([fuse]).run(gm, debug_counter=fp.core.DebugCounter(count=3), instrument=[Spy()])
    fused = [n for n in gm.graph.nodes if n.target is torch.ops.fxpass.fused_add_rmsnorm.default]
    assert len(fused) == 3 and seen == ["replace_pattern"] * 3


# ----- fuzzed graphs ----------------------------------------------------------------------
_OPS = [torch.add, torch.mul, torch.sub]


@st.composite
def _programs(draw):
    n = draw(st.integers(3, 12))
    steps = []
    for i in range(n):
        op = draw(st.sampled_from(["relu", "neg", *range(len(_OPS))]))
        a = draw(st.integers(0, i + 1))
        b = draw(st.integers(0, i + 1))
        steps.append((op, a, b))
    return steps


def _build(steps):
    g = torch.fx.Graph()
    vals = [g.placeholder("x"), g.placeholder("y")]
    for op, a, b in steps:
        if op == "relu":
            vals.append(g.call_function(torch.relu, (vals[a],)))
        elif op == "neg":
            vals.append(g.call_function(torch.neg, (vals[a],)))
        else:
            vals.append(g.call_function(_OPS[op], (vals[a], vals[b])))
    g.output(vals[-1])
    g.eliminate_dead_code()
    return torch.fx.GraphModule(torch.nn.Module(), g)


_PATTERNS = [
    (lambda x, y: torch.relu(torch.add(x, y)), lambda x, y: torch.clamp(torch.add(x, y), min=0)),
    (lambda x: torch.neg(torch.neg(x)), lambda x: torch.mul(x, 1)),
    (lambda x, y: torch.mul(torch.relu(x), y), lambda x, y: torch.mul(y, torch.relu(x))),
    (lambda x: torch.add(x, x), lambda x: torch.mul(x, 2)),
]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_programs(), st.integers(0, len(_PATTERNS) - 1))
def test_fuzzed_graphs_rewrite_like_torch_and_keep_values(steps, which):
    gm = _build(steps)
    pattern, replacement = _PATTERNS[which]
    a, b = copy.deepcopy(gm), copy.deepcopy(gm)
    ra = torch_rewriter.replace_pattern(a, pattern, replacement)
    rb = cfx.replace_pattern(b, pattern, replacement)
    assert [_names(m.nodes_map) for m in ra] == [_names(m.nodes_map) for m in rb]
    assert a.code == b.code
    b.graph.lint()
    x, y = torch.randn(5), torch.randn(5)
    torch.testing.assert_close(b(x, y), gm(x, y))


class _TimesFour(torch.nn.Module):
    def forward(self, v):
        return torch.neg(torch.mul(v, torch.tensor(4.0)))


def test_a_replacement_functions_own_constant_is_copied_not_confused():
    def pattern(x, y):
        return torch.mul(x, y)

    def replacement(x, y):
        return torch.sub(x, y * torch.tensor(2.0))

    v = torch.randn(5)
    ours = torch.fx.symbolic_trace(_TimesFour())
    done = cfx.replace_pattern(ours, pattern, replacement)
    assert _names(done[0].nodes_map)["y"] == "_tensor_constant0"  # bound: the get_attr
    torch.testing.assert_close(ours(v), torch.neg(v - 4.0 * 2.0))
    # torch's copy reads the module's own _tensor_constant0 (4.0) for the replacement's 2.0
    theirs = torch.fx.symbolic_trace(_TimesFour())
    torch_rewriter.replace_pattern(theirs, pattern, replacement)
    torch.testing.assert_close(theirs(v), torch.neg(v - 4.0 * 4.0))
