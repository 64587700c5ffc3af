"""Explain a miss: the first failing constraint, at a node or over a graph."""

from __future__ import annotations

import torch

from fxpass.rewrite import P, Rule, explain, rules

from _models import exported_gm

aten = torch.ops.aten
x = P.var("x")


def _norm(h, eps=None):
    var = P(aten.mean.dim, P(aten.pow.Tensor_Scalar, h, 2), [-1], True)
    return P(
        aten.mul.Tensor, h, P(aten.rsqrt.default, P(aten.add.Tensor, var, eps or P.const("eps")))
    )


def test_wrong_op_at_the_root_and_inside():
    gm = exported_gm()
    rule = Rule(_norm(P.cast(x, torch.float32)), lambda x, eps: None, drop_users=())
    embedding = next(n for n in gm.graph.nodes if n.target is aten.embedding.default)
    e = explain(rule, embedding)
    assert not e and "wrong op at the root" in str(e) and "aten.mul.Tensor" in str(e)
    rope = next(n for n in gm.graph.nodes if n.target is aten.mul.Tensor and "slice" in str(n.args))
    reason = explain(rule, rope).reason  # a RoPE product: neither operand is the norm's
    assert reason.startswith("wrong op: expected") and "aten.permute.default" in reason


def test_extra_user_names_the_user():
    gm = exported_gm()  # export's asserts hang off the norm
    rule = Rule(
        P.cast(_norm(P.cast(x, torch.float32)), torch.bfloat16), lambda x, eps: None, drop_users=()
    )
    why = explain(rule, gm)
    assert not why.matches
    assert "extra user" in str(why.closest) and "_assert_tensor_metadata" in str(why.closest)
    assert why.reasons["extra user"] >= 1


def test_literal_dtype_and_binding_reasons():
    gm = exported_gm(remove_asserts=True)
    eps = Rule(_norm(P.cast(x, torch.float32), eps=1e-3), lambda x: None)
    assert "literal differs" in str(explain(eps, gm))
    dtype = Rule(
        _norm(P.cast(P.node("x", dtype=torch.float16), torch.float32)), lambda x, eps: None
    )
    assert "dtype of" in str(explain(dtype, gm))
    where = Rule(_norm(P.cast(x, torch.float32)), lambda x, eps: None, where=lambda eps: eps > 1)
    assert "where(...) returned False" in str(explain(where, gm))


def test_matches_are_reported_with_their_nodes():
    gm = exported_gm(remove_asserts=True)
    rule = Rule(_norm(P.cast(x, torch.float32)), lambda x, eps: None)
    why = explain(rule, gm)
    assert len(why.matches) == 5 and bool(why)
    assert "matches at 5 of" in str(why)
    assert explain(rule, why.matches[0]).matched


def test_a_rule_set_explains_each_rule():
    gm = exported_gm(remove_asserts=True)
    rs = rules(
        "two", [(P(aten.relu.default, x), lambda x: x), (P(aten.sigmoid.default, x), lambda x: x)]
    )
    out = explain(rs, gm)
    assert len(out) == 2
    assert "no node calls its root op (aten.relu.default)" in str(out[0])
    assert out[1].matches  # SwiGLU's silu is sigmoid * x in core ATen
    assert not rs.explain(gm, rs.rules[0].name).matches


def test_cycle_reason():
    def f(a):
        s = torch.add(a, 1)
        t = torch.sigmoid(s)  # leaves the would-be region
        return torch.mul(s, torch.add(t, 2))  # and comes back into it

    gm = torch.fx.symbolic_trace(f)
    s = P(torch.add, x, 1).named("s")
    rule = Rule(P(torch.mul, s, P(torch.add, P.var("t"), 2)), lambda x, t: (x, x), outputs=["s"])
    why = explain(rule, gm)
    assert not why.matches and "cycle" in str(why)


def test_near_misses_are_deep_misses_on_a_check_or_a_view():
    from fxpass.rewrite.explain import near_misses

    gm = exported_gm()
    deep = Rule(P(aten.rsqrt.default, P(aten.add.Tensor, P.any(), 1e-5)), lambda: None)
    misses = near_misses(deep, gm.graph)  # eps is 1e-6: a literal check, past the root
    assert len(misses) == 5 and all("literal differs" in e.reason for e in misses)
    other = Rule(P(aten.rsqrt.default, P(aten.sub.Tensor, P.any(), P.any())), lambda: None)
    assert not near_misses(other, gm.graph)  # a graph computing something else


class _Flat(torch.nn.Module):
    def forward(self, x, r):
        return torch.relu(torch.sin(x + r).reshape(-1, 8)), x + r


def test_a_view_in_front_of_an_op_the_rule_names_is_a_near_miss():
    from fxpass.rewrite.explain import near_misses

    gm = torch.export.export(_Flat(), (torch.randn(2, 4, 8), torch.randn(2, 4, 8))).graph_module
    sin = P(aten.sin.default, P(aten.add.Tensor, P.var("a"), P.var("b")))
    strict = Rule(P(aten.relu.default, sin), lambda a, b: None)
    (miss,) = near_misses(strict, gm.graph)
    assert "got aten.reshape.default" in miss.reason
    seeing = Rule(P(aten.relu.default, P.through(sin)), lambda a, b: None)
    assert len(explain(seeing, gm).matches) == 1


# ----- what the report says ----------------------------------------------------------------------
def test_no_near_miss_hint_once_every_norm_is_fused():
    """Olmo3 (q/k RMSNorm over the projection, then rotary): after the default pipeline fused
    every norm, the rotary ``mul`` behind a view of the q/k norm is not a near miss."""
    import pytest

    import fxpass as fp

    _hf = pytest.importorskip("_hf")
    result = fp.apply(_hf.exported("olmo3", layers=1))
    gm = result.graph_module
    assert not [n for n in gm.graph.nodes if n.target is torch.ops.aten.rsqrt.default]
    assert not [h for rec in result.report.passes for h in rec.hints if str(h)]
    assert "near miss" not in str(result.report)


def test_a_hint_drops_the_sites_a_later_pass_fused():
    import sys
    from pathlib import Path

    import fxpass as fp

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cli"))
    from cli_targets import strict_add_norm, tiny_fp32

    alone = fp.Pipeline([strict_add_norm]).run(tiny_fp32().graph_module).report
    assert "near misses" in str(alone.find("strict_add_norm").hints[0])
    report = fp.Pipeline([strict_add_norm, "fuse_add_rmsnorm"]).run(tiny_fp32().graph_module).report
    (hint,) = report.find("strict_add_norm").hints
    assert str(hint) == "" and not hint  # every site it came close to is fused now
    assert "hint:" not in str(report)
    assert report.to_dict()["root"]["children"][0]["hints"] == []


def test_a_rule_set_that_rewrites_nothing_says_why():
    import fxpass as fp

    nothing = rules("nothing", [(P(torch.ops.aten.cosh.default, P.var("x")), lambda x: x)])
    report = fp.Pipeline([nothing]).run(exported_gm()).report
    (note,) = report.find("nothing").notes
    assert note.startswith("found nothing to rewrite: ")
    assert "no node calls aten.cosh.default" in note
    assert "note: nothing: found nothing to rewrite" in str(report)


class _ReluTimesTwo(torch.nn.Module):
    def forward(self, x):
        return x.relu() * 2


class _ReluTimesTwoInACond(torch.nn.Module):
    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda x: x.relu() * 2, lambda x: x.cos(), (x,))


_MUL_ONE = Rule(P(aten.mul.Tensor, P(aten.relu.default, x), 1), lambda x: x, name="mul_one")


def _note(rule_set, module) -> str:
    import fxpass as fp

    ep = torch.export.export(module, (torch.randn(3),))
    (note,) = fp.Pipeline([rule_set]).run(ep.graph_module).report.find(rule_set.name).notes
    return note


def test_a_pass_that_finds_nothing_names_its_closest_near_miss_in_one_line():
    """A mul-by-one rule on a graph that multiplies by two: the note says where and why
    (the literal), on one line; a rule with no candidate at all gets no pointer."""
    from fxpass.fxutil.messages import LIMIT

    note = _note(rules("mul_one", [_MUL_ONE]), _ReluTimesTwo())
    assert "\n" not in note and len(note) <= LIMIT
    assert note.startswith("found nothing to rewrite: 'mul_one': tried at 1 nodes, none matched")
    assert "closest near miss: 'mul_one' at %mul: literal differs" in note
    assert "expected 1" in note and "says why" not in note
    nothing = rules("nothing", [(P(aten.cosh.default, x), lambda x: x)])
    note = _note(nothing, _ReluTimesTwo())
    assert "near miss" not in note and "says why" not in note


def test_a_near_miss_inside_a_cond_branch_names_the_branch():
    note = _note(rules("mul_one", [_MUL_ONE]), _ReluTimesTwoInACond())
    assert "closest near miss: 'mul_one' at %mul in true_graph_0: literal differs" in note


def test_a_hint_scans_for_near_misses_only_when_read(monkeypatch):
    """The rewriter leaves the near-miss scan to the first reader of the hint: a pipeline
    whose report nobody reads does not pay for it; the text is the same when read."""
    import sys
    from pathlib import Path

    import fxpass as fp

    # the module (the package's attribute of that name is the function)
    explain_mod = sys.modules["fxpass.rewrite.explain"]
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cli"))
    from cli_targets import strict_add_norm, tiny_fp32

    scans = []
    real = explain_mod.near_misses
    monkeypatch.setattr(
        explain_mod, "near_misses", lambda *a, **k: scans.append(1) or real(*a, **k)
    )
    report = fp.Pipeline([strict_add_norm]).run(tiny_fp32().graph_module).report
    assert scans == []  # the pass ran, nothing read its hint yet
    (hint,) = report.find("strict_add_norm").hints
    text = str(hint)
    assert scans and "rule 'strict' was tried at" in text and "3 near misses" in text
    assert str(hint) == text
