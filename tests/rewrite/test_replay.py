"""Recorded replacements (``Rule(..., replay=True)``): run once per kind of match, copied at
the others, with exactly the graph, values and metadata the replacement gives every time."""

from __future__ import annotations

import re

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from fxpass.passes.fusion.fuse_add_rmsnorm import RULES, fuse_add_rmsnorm
from fxpass.rewrite import P, Rule, rewrite

from _models import exported_gm

aten = torch.ops.aten
x = P.var("x")


def _describe(gm) -> list:
    """Every node: name, op, target, arguments, metadata (values by their metadata and by
    which node's value object they are)."""
    first: dict[int, int] = {}
    out = []
    for i, n in enumerate(gm.graph.nodes):
        meta = {}
        for key, v in n.meta.items():
            if key == "val":
                vals = v if isinstance(v, (tuple, list)) else (v,)
                meta[key] = tuple(_value(t, first, i) for t in vals)
            else:  # torch's from_node records name the graph object: compare without it
                meta[key] = re.sub(r"graph_id=\d+", "", str(v))
        out.append((n.name, n.op, str(n.target), str(n.args), str(n.kwargs), meta))
    return out


def _value(t, first: dict[int, int], i: int):
    if not isinstance(t, torch.Tensor):
        return t
    same = first.setdefault(id(t), i)  # the first node holding this very tensor
    return (type(t), tuple(t.shape), t.stride(), t.dtype, t.requires_grad, same)


def test_a_recorded_fusion_makes_the_graph_the_replacement_makes(monkeypatch):
    rule = RULES.rules[0]
    assert rule.recordings is not None
    replayed = exported_gm(remove_asserts=True, layers=3)
    rule.recordings._by_key.clear()
    fuse_add_rmsnorm(replayed)
    monkeypatch.setattr(rule, "recordings", None)  # the replacement at every match
    plain = exported_gm(remove_asserts=True, layers=3)
    fuse_add_rmsnorm(plain)
    assert _describe(replayed) == _describe(plain)
    fused = torch.ops.fxpass.fused_add_rmsnorm.default
    assert sum(n.target is fused for n in replayed.graph.nodes) == 6


def _calls(gm, rule) -> int:
    return rewrite(gm, [rule]).rewrites


def test_the_replacement_runs_once_per_signature():
    calls = []

    def to_div(x):
        calls.append(x)
        return torch.ops.aten.div.Tensor(1.0, torch.ops.aten.sqrt.default(x))

    rule = Rule(P(aten.rsqrt.default, x), to_div, name="rsqrt_to_div", replay=True)
    gm = exported_gm(layers=4)
    sites = _calls(gm, rule)
    assert sites == 9 and len(calls) == 1  # every rsqrt reads a (1, 8, 1) float32 value
    assert not any(n.target is aten.rsqrt.default for n in gm.graph.nodes)
    for n in gm.graph.nodes:
        if n.target in (aten.div.Tensor, aten.sqrt.default):
            assert tuple(n.meta["val"].shape) == (1, 8, 1)
            assert n.meta["fxpass_provenance"]["rule"] == "rsqrt_to_div"
    # other metadata: another signature, the replacement again
    g = make_fx(lambda a, b: (torch.rsqrt(a), torch.rsqrt(b)), tracing_mode="fake")(
        torch.randn(2, 3), torch.randn(4, dtype=torch.float64)
    )
    rule = Rule(P(aten.rsqrt.default, x), to_div, name="r", replay=True)
    calls.clear()
    assert _calls(g, rule) == 2 and len(calls) == 2


@pytest.mark.parametrize("kind", ["match", "meta"])
def test_a_replacement_that_reads_more_than_values_is_run_at_every_match(kind):
    calls = []

    def reads_match(x, match):
        calls.append(match)
        return torch.ops.aten.div.Tensor(1.0, torch.ops.aten.sqrt.default(x))

    def writes_meta(x):
        calls.append(x)
        out = torch.ops.aten.div.Tensor(1.0, torch.ops.aten.sqrt.default(x))
        out.node.meta["mine"] = len(calls)
        return out

    fn = reads_match if kind == "match" else writes_meta
    rule = Rule(P(aten.rsqrt.default, x), fn, name="r", replay=True)
    assert (rule.recordings is None) == (kind == "match")
    gm = exported_gm(layers=2)
    assert _calls(gm, rule) == 5 and len(calls) == 5
    if kind == "meta":
        marks = [n.meta["mine"] for n in gm.graph.nodes if "mine" in n.meta]
        assert marks == [1, 2, 3, 4, 5]
