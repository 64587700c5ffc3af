"""``PatternMatcherPass.explain`` names why a registered pattern missed where it did, and a
``PatternMatcherPass`` run as an fxpass pass reports its matches, the extra sites the
improvements found, and the near misses of a pattern that matched few of its tries."""

from __future__ import annotations

import copy

import torch
from _ind_support import make_graph

import fxpass as fp
import fxpass.compat.inductor as fxi

aten = torch.ops.aten


def norm(x, w, eps):
    h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return w * h


def model(x, w):
    a = norm(x, w, 1e-6)
    b = norm(torch.relu(a), w, 1e-5)
    s = b + x
    return norm(s, w, 1e-6) + s  # the sum has another user


def registered(**kw):
    p = fxi.PatternMatcherPass(pass_name="rms", **kw)

    def search(x, w):
        return norm(x, w, 1e-6)

    def replace(x, w):
        return torch.ops.fxpass.rms_norm(x, w, 1e-6)

    fxi.register_replacement(search, replace, [torch.empty(2, 8), torch.empty(8)], fxi.fwd_only, p)
    return p


def graph():
    return make_graph(model, torch.randn(4, 16), torch.randn(16))


def test_explain_names_each_miss_and_its_reason():
    e = registered().explain(graph())
    (pattern,) = e
    assert pattern.candidates == 6 and len(pattern.matches) == 2  # the muls; 2 norms fit
    reasons = pattern.reasons()
    assert reasons.get("constant_args") == 1, str(e)  # the 1e-5 norm's eps
    assert "constant_args" in str(e) and "1e-05" in str(e)


def test_explain_counts_what_only_the_improvements_match():
    def search(x, w):
        return norm(x, w, 1e-6) * 2.0

    def replace(x, w):
        return torch.ops.fxpass.rms_norm(x, w, 1e-6) * 2.0

    p = fxi.PatternMatcherPass(improve=True)
    fxi.register_replacement(search, replace, [torch.empty(2, 8), torch.empty(8)], fxi.fwd_only, p)

    def f(x, w):
        n = norm(x, w, 1e-6)
        return n * 2.0, n  # the norm is used twice: an intermediate with another user

    gm = make_graph(f, torch.randn(4, 16), torch.randn(16))
    (pattern,) = p.explain(gm)
    assert len(pattern.extra) == 1 and not pattern.matches
    assert "1 more with the improvements" in str(pattern)
    assert p.apply(gm) == 1 and p.stats.extra == 1


def test_a_pattern_matcher_pass_reports_in_an_fxpass_pipeline():
    gm = graph()
    x, w = torch.randn(4, 16), torch.randn(16)
    expected = copy.deepcopy(gm)(x, w)
    result = fp.apply(gm, registered())
    stats = result.report.stats()
    assert stats["rms.matches"] == 2 and stats["rms.extra_sites"] == 0
    assert stats["rms.replace.tried"] == 4  # the muls left when the walk reaches them
    torch.testing.assert_close(result.graph_module(x, w), expected)


def test_a_pattern_matching_few_of_its_tries_gets_a_hint_in_the_report():
    def f(x, w):
        out = x
        for i in range(8):
            out = norm(torch.relu(out), w, 1e-5 if i else 1e-6)
        return out

    gm = make_graph(f, torch.randn(4, 16), torch.randn(16))
    result = fp.apply(gm, registered())
    hints = "\n".join(h for r in result.report.passes for h in r.hints)
    assert "pattern 'replace' was tried at 15 nodes and matched 1" in hints
    assert "constant_args" in hints


def test_the_debug_counter_stops_the_replacements():
    gm = graph()
    result = fp.apply(gm, registered(), debug_counter=fp.DebugCounter(count=1))
    assert result.report.stats()["rms.matches"] == 1
