"""The standard analyses on real graphs, and the changes they take in instead of being
computed again."""

from __future__ import annotations

import torch

import fxpass as fp
from fxpass.core.analyses import aliasing, fake_values, positions, users

import _models

aten = torch.ops.aten


class _Twins(torch.nn.Module):
    """Two identical products, each read through a view: cse merges them, and the second
    view's memory becomes the first product's."""

    def forward(self, x):
        a, b = x * 2, x * 2
        return a.view(-1) + b.view(-1), b.t()


def _twins_gm():
    ep = torch.export.export(_Twins(), (torch.randn(4, 4),))
    return ep.run_decompositions().graph_module


def test_positions_and_users_follow_the_graph_order():
    gm = _models.exported_gm()
    nodes = list(gm.graph.nodes)
    pos = positions(gm)
    assert [pos[n] for n in nodes] == list(range(len(nodes)))
    use = users(gm)
    assert all(set(use[n]) == set(n.users) for n in nodes)
    assert all(list(use[n]) == sorted(n.users, key=pos.__getitem__) for n in nodes)


def test_aliasing_takes_in_cses_merges_exactly():
    seen = {}

    def look(gm):
        seen["before"] = aliasing(gm)
        return False

    def check(gm):
        info = aliasing(gm)
        assert info is seen["before"]  # served: cse's merges were taken in
        fresh = aliasing.compute(gm.graph)
        assert aliasing.equal(info, fresh)
        view = next(n for n in gm.graph.nodes if n.target is aten.permute.default)
        assert info.roots(view) == fresh.roots(view) == {view, view.args[0]}
        return False

    result = fp.Pipeline([look, "cse", check], verify_analyses=True).run(_twins_gm())
    assert result.report.find("cse").stats["merged"] == 2  # the products, then their views
    assert result.report.analysis_counts()["check"] == {"aliasing": [0, 1]}


def test_fake_values_propagate_and_name_stale_values():
    gm = _models.exported_gm()
    values = fake_values(gm)
    assert values.stale() == [] and len(values) == len(gm.graph.nodes) - 1  # not the output
    mul = next(n for n in gm.graph.nodes if n.target is aten.mul.Tensor)
    with mul.meta["val"].fake_mode:
        mul.meta["val"] = mul.meta["val"].sum()  # a pass that got the value wrong
    assert fake_values(gm).stale() == [mul]


def test_dce_keeps_every_analysis_it_preserves():
    def ask(gm):
        for a in (positions, users, aliasing, fake_values):
            a(gm)
        return False

    gm = _models.exported_gm()
    x = next(n for n in gm.graph.nodes if n.op == "placeholder")
    with gm.graph.inserting_after(x):
        dead = gm.graph.call_function(aten.neg.default, (x,))
    dead.meta["val"] = x.meta["val"]
    result = fp.Pipeline([ask, "dce", ask], verify_analyses=True).run(gm)
    assert result.report.find("dce").stats["removed"] == 1
    assert result.report.analysis_counts()["ask"] == {
        "positions": [1, 2],  # users asked for it once more
        "users": [1, 1],
        "aliasing": [1, 1],
        "fake_values": [1, 1],
    }
