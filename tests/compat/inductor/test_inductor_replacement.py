"""``register_replacement``, differentially against Inductor's: the same sites replaced and
the same outputs — for sizes other than the examples', other dtypes, other literals,
symbolic sizes, scalars captured by ``scalar_workaround``, bound methods, given patterns —
while fxpass traces each function once per signature instead of once per match."""

from __future__ import annotations

import copy
import functools

import pytest
import torch
from _ind_support import MATCHERS, make_graph, pattern_matcher, same

import fxpass.compat.inductor as fxi

aten = torch.ops.aten


def rms(x, w, eps=1e-6):
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return w * h.to(x.dtype)


def model(x, w1, w2):
    """Four RMSNorms, two viewed to other sizes in between."""
    a = rms(x, w1)
    b = rms(torch.relu(a).view(-1, a.shape[-1]), w2)
    c = rms(b.view(a.shape) + x, w1, 1e-5)
    return rms(c * 2, w2) + c


def inputs(dtype=torch.float32, batch=3, hidden=32):
    g = torch.Generator().manual_seed(0)
    return [
        torch.randn(batch, 8, hidden, generator=g).to(dtype),
        torch.randn(hidden, generator=g).to(dtype),
        torch.randn(hidden, generator=g).to(dtype),
    ]


def search(x, w):
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
    return w * h.to(x.dtype)


def replace(x, w):
    """A different spelling of the same norm, with a size-dependent reshape."""
    flat = x.reshape(-1, x.shape[-1]).float()
    out = flat * torch.rsqrt((flat * flat).mean(-1, keepdim=True) + 1e-6)
    return w * out.to(x.dtype).reshape(x.shape)


def counting(trace_fn, calls):
    @functools.wraps(trace_fn)
    def trace(fn, args, **kw):
        calls.append(fn)
        return trace_fn(fn, args, **kw)

    trace.__name__ = "fwd_only"
    return trace


def apply(matcher, gm, examples, *, search=search, replace=replace, **kw):
    """Register with ``matcher`` (examples: the example inputs), apply to a copy of ``gm``;
    returns (count, the rewritten module, the number of traces)."""
    pm = pattern_matcher(matcher)
    calls: list = []
    p = pm.PatternMatcherPass()
    pm.register_replacement(search, replace, examples, counting(pm.fwd_only, calls), p, **kw)
    gm = copy.deepcopy(gm)
    return p.apply(gm.graph), gm, len(calls)


def agree(gm, args, examples, **kw):
    results = {m: apply(m, gm, examples, **kw) for m in MATCHERS}
    (n_ours, ours, traces_ours), (n_theirs, theirs, traces_theirs) = (
        results["fxpass"],
        results["inductor"],
    )
    assert n_ours == n_theirs
    ours.recompile()
    theirs.recompile()
    assert same(ours(*args), theirs(*args))
    return n_ours, traces_ours, traces_theirs


def test_sizes_other_than_the_examples_are_matched_and_replayed_without_tracing_again():
    args = inputs()
    gm = make_graph(model, *args)
    examples = [torch.empty(2, 16), torch.empty(16)]
    count, ours, theirs = agree(gm, args, examples)
    assert count == 3  # eps 1e-5 is another literal: not this pattern
    # fxpass: the search function once to register (as Inductor), then the two functions
    # once per signature (rank 2, rank 3), with the first sizes seen, reused by the others;
    # Inductor: the pattern once, the search function again at each of the 4 sites it
    # matches size-blind, the replacement again at each of the 3 it keeps
    assert ours == 1 + 2 * 2 and theirs == 1 + 4 + count


def test_registration_traces_as_inductor_and_many_sizes_share_one_symbolic_trace():
    """Registering traces the search function once, as Inductor's does; matches of one
    signature trace the two functions with the first sizes met, and all other sizes share
    one trace with symbolic sizes (Inductor: two traces per match)."""

    def many(*xs_and_w):
        *xs, w = xs_and_w
        return [search(x, w) for x in xs]

    args = [torch.randn(rows, 32) for rows in (2, 3, 5, 7, 9, 11)] + [torch.randn(32)]
    gm = make_graph(many, *args)
    examples = [torch.empty(2, 16), torch.empty(16)]
    pm = pattern_matcher("fxpass")
    calls: list = []
    pm.register_replacement(
        search, replace, examples, counting(pm.fwd_only, calls), pm.PatternMatcherPass()
    )
    assert len(calls) == 1  # the search function, as Inductor
    count, ours, theirs = agree(gm, args, examples)
    assert count == 6
    assert ours == 1 + 2 + 2 and theirs == 1 + 2 * count


def test_other_dtypes_match_as_inductor_s_retrace_finds_them():
    args = inputs(torch.bfloat16)
    gm = make_graph(model, *args)
    count, ours, _ = agree(gm, args, [torch.empty(2, 16, dtype=torch.float16), torch.empty(16)])
    assert count == 3  # x.dtype is read from the input: Inductor's re-trace gives bfloat16
    # the search function to register, then a pair of traces per signature met (bf16 rank 3,
    # rank 2), with its first sizes
    assert ours == 5
    fp32 = make_graph(model, *inputs())
    count, _, _ = agree(fp32, inputs(), [torch.empty(2, 16, dtype=torch.float16), torch.empty(16)])
    assert count == 0  # float32 inputs have no casts: no match, as Inductor's trace says


def test_scalar_workaround_captures_the_literal_for_the_replacement():
    args = inputs()
    gm = make_graph(model, *args)

    def search_eps(x, w, eps):
        return rms(x, w, eps)

    def replace_eps(x, w, eps):
        return torch.ops.fxpass.rms_norm(x, w, eps)

    count, _, _ = agree(
        gm,
        args,
        [torch.empty(2, 16), torch.empty(16)],
        search=search_eps,
        replace=replace_eps,
        scalar_workaround={"eps": 0.123},
    )
    assert count == 4


def test_symbolic_sizes_stay_symbolic_in_the_replacement():
    gm = torch.fx.experimental.proxy_tensor.make_fx(
        lambda x, w: search(x, w) * 2, tracing_mode="symbolic"
    )(torch.randn(6, 32), torch.randn(32))
    count, out, traces = apply("fxpass", gm, [torch.empty(2, 16), torch.empty(16)])
    # the search function to register, then the pair for the graph's symbolic sizes
    assert count == 1 and traces == 3
    sizes = out.graph.find_nodes(op="call_function", target=aten.sym_size.int)
    assert sizes, "the reshape's size is read from the graph, not baked in"
    x, w = torch.randn(5, 32), torch.randn(32)
    out.recompile()
    torch.testing.assert_close(out(x, w), search(x, w) * 2)


def test_sizes_the_trace_assumed_otherwise_get_a_trace_of_their_own():
    def branchy(x, w):
        return w * (x * (2.0 if x.shape[0] > 4 else 3.0))  # a guard of the symbolic trace

    def replace_branchy(x, w):
        return (x * w) * (2.0 if x.shape[0] > 4 else 3.0)

    def f(x, y, z, w):
        return w * (x * 2.0), w * (y * 3.0), w * (z * 2.0)

    args = [torch.randn(8, 4), torch.randn(2, 4), torch.randn(2, 4), torch.randn(4)]
    gm = make_graph(f, *args)
    count, ours, _ = agree(
        gm, args, [torch.empty(8, 4), torch.empty(4)], search=branchy, replace=replace_branchy
    )
    assert count == 2  # 2 rows ask for 3.0: z's 2.0 is no match
    # the search function to register; the pair for the first sizes met; for the others
    # the pair with symbolic sizes (its guard, rows > 4 or not, holds for them)
    assert ours == 5


@pytest.mark.parametrize("matcher", MATCHERS)
def test_duplicates_raise_unless_skipped(matcher):
    pm = pattern_matcher(matcher)
    p = pm.PatternMatcherPass()
    examples = [torch.empty(2, 16), torch.empty(16)]
    assert pm.register_replacement(search, replace, examples, pm.fwd_only, p)
    assert (
        pm.register_replacement(search, replace, examples, pm.fwd_only, p, skip_duplicates=True)
        is False
    )
    with pytest.raises(RuntimeError, match="Duplicate pattern"):
        pm.register_replacement(search, replace, examples, pm.fwd_only, p)


def test_bound_methods_and_list_arguments_register_as_inductor_s():
    class Sum:
        def __init__(self, e):
            self.e = e

        def pattern(self, xs, y):
            return xs[0].pow(self.e) + xs[1].pow(self.e) + y

        def replacement(self, xs, y):
            return (xs[0] + xs[1]).pow(self.e) + y

    def f(a, b, c):
        return a.pow(2) + b.pow(2) + c

    args = [torch.randn(3, 3) for _ in range(3)]
    gm = make_graph(f, *args)
    s = Sum(2)
    seen = {}

    def check(match):
        seen[type(match).__module__] = sorted(match.kwargs)
        return True

    examples = [[torch.empty(2, 2), torch.empty(2, 2)], torch.empty(2, 2)]
    count, _, _ = agree(
        gm, args, examples, search=s.pattern, replace=s.replacement, extra_check=check
    )
    assert count == 1
    assert list(seen.values()) == [["xs", "y"], ["xs", "y"]]


def test_a_given_search_pattern_is_used_as_it_is():
    args = inputs()
    gm = make_graph(model, *args)
    examples = [torch.empty(2, 16), torch.empty(16)]
    for m in MATCHERS:
        pm = pattern_matcher(m)
        pattern = pm.gen_pattern(search, examples, pm.fwd_only)
        p = pm.PatternMatcherPass()
        pm.register_replacement(
            search, replace, examples, pm.fwd_only, p, search_fn_pattern=pattern
        )
        assert p.apply(copy.deepcopy(gm).graph) == 4  # the given pattern ignores eps


def test_replacement_nodes_get_values_and_provenance():
    args = inputs()
    gm = make_graph(model, *args)
    count, out, _ = apply("fxpass", gm, [torch.empty(2, 16), torch.empty(16)])
    assert count == 3
    new = [n for n in out.graph.nodes if "fxpass_provenance" in n.meta]
    assert new and all("val" in n.meta for n in new)
    assert {n.meta["fxpass_provenance"]["rule"] for n in new} == {"replace"}
    assert any("original_aten" in n.meta for n in new)


def test_gen_register_replacement_traces_instead_of_loading_a_file():
    p = fxi.PatternMatcherPass()
    examples = [torch.empty(2, 16), torch.empty(16)]
    fxi.gen_register_replacement("my_rms", search, replace, examples, fxi.fwd_only, p)
    args = inputs()
    gm = copy.deepcopy(make_graph(model, *args))
    assert p.apply(gm) == 3
    assert fxi._known_precompiled_patterns[-1][0] is search


def test_register_replacement_says_what_is_wrong():
    p = fxi.PatternMatcherPass()
    with pytest.raises(TypeError, match="example_inputs must be a list or tuple"):
        fxi.register_replacement(search, replace, torch.empty(2), fxi.fwd_only, p)
    with pytest.raises(TypeError, match="only 1 example inputs"):
        fxi.register_replacement(search, replace, [torch.empty(2, 2)], fxi.fwd_only, p)


class _InPlaceNorm(torch.nn.Module):
    """A mutating custom op called in place: functionalization makes it an
    ``auto_functionalized_v2`` node (torch.compile's default)."""

    def forward(self, x, r, w):
        x, r = x.clone(), r.clone()
        torch.ops.fxpass.fused_add_rmsnorm_(x, r, w, 1e-6)
        return x * 2, r + 1


def test_auto_functionalized_patterns_match_v2_nodes_with_the_improvements():
    from _captures import dynamo_capture
    from torch._higher_order_ops.auto_functionalize import auto_functionalized

    args = (torch.randn(4, 16), torch.randn(4, 16), torch.randn(16))
    gm, real = dynamo_capture(_InPlaceNorm(), args, "aot")
    v2 = torch.ops.higher_order.auto_functionalized_v2
    assert gm.graph.find_nodes(op="call_function", target=v2)

    def search(x, r, w):  # written as vLLM writes its patterns: auto_functionalized (v1)
        at = auto_functionalized(
            torch.ops.fxpass.fused_add_rmsnorm_.default, x=x, residual=r, weight=w, eps=1e-6
        )
        return at[1], at[2]

    def replace(x, r, w):
        normed, total = torch.ops.fxpass.fused_add_rmsnorm(x, r, w, 1e-6)
        return normed, total

    examples = [torch.empty(2, 16), torch.empty(2, 16), torch.empty(16)]
    for m in MATCHERS:
        assert apply(m, gm, examples, search=search, replace=replace)[0] == 0
    with fxi.improvements():
        count, out, _ = apply("fxpass", gm, examples, search=search, replace=replace)
    assert count == 1
    assert not out.graph.find_nodes(op="call_function", target=v2)
    out.recompile()
    expected = _InPlaceNorm()(*args)
    assert same(list(out(*real)), list(expected))


def _linear_gelu(x, w):
    return torch.nn.functional.gelu(x @ w) * 0.5


@pytest.mark.parametrize("trace", ["fwd_only", "joint_fwd_bwd"])
def test_generated_patterns_are_inductor_s(trace):
    grad = trace == "joint_fwd_bwd"
    examples = [torch.randn(4, 8, requires_grad=grad), torch.randn(8, 8, requires_grad=grad)]
    texts = []
    for m in MATCHERS:
        pm = pattern_matcher(m)
        texts.append(repr(pm.gen_pattern(_linear_gelu, examples, getattr(pm, trace))))
    assert texts[0] == texts[1]


def test_replace_by_example_takes_the_values_of_a_trace_made_on_the_match_s_values():
    # Inductor's replacement nodes take the values of the trace it made for the match; the
    # trace of a signature's first sizes is made on that match's very values, so its copy
    # there takes them too; a later match of the same sizes (other values) computes its own
    def two(x, y):
        return torch.relu(x) + torch.relu(y)

    gm = make_graph(two, torch.randn(4, 8), torch.randn(4, 8))
    traces: list = []

    def trace_fn(fn, args):
        out = fxi.fwd_only(fn, args)
        traces.append((out, [a for a in args]))
        return out

    p = fxi.PatternMatcherPass()
    sites: list = []

    @fxi.register_graph_pattern(
        fxi.CallFunction(aten.relu.default, fxi.KeywordArg("x")), pass_dict=p
    )
    def _relu(match, x):
        def repl(x):
            return (x.clamp_min(0.0) * 2.0) / 2.0

        sites.append(x.meta["val"])
        match.replace_by_example(repl, [x], trace_fn=trace_fn)

    assert p.apply(gm.graph) == 2
    assert len(traces) == 1 and traces[0][1] == [sites[0]]  # traced once, on the first site
    traced = [n.meta["val"] for n in traces[0][0].graph.nodes if n.op == "call_function"]
    new = [n for n in gm.graph.nodes if "fxpass_provenance" in n.meta]
    assert len(new) == 2 * len(traced)
    groups: dict = {}
    for n in new:  # per site, in graph order
        groups.setdefault(tuple(n.meta["fxpass_provenance"]["replaced"]), []).append(n)
    first, second = sorted(groups.values(), key=lambda g: g[0].args[0].meta["val"] is not sites[0])
    assert len(first) == len(traced)
    assert all(n.meta["val"] is t for n, t in zip(first, traced))  # the trace's own values
    assert all(
        n.meta["val"] is not t and n.meta["val"].shape == t.shape and n.meta["val"].dtype == t.dtype
        for n, t in zip(second, traced)
    )
    gm.recompile()
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    assert torch.allclose(gm(x, y), two(x, y))
