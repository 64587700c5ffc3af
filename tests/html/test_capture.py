from __future__ import annotations

import copy
import operator

import planted_passes
import torch
from _html_helpers import big_graph, fuse_mul_relu, tiny_gm
from torch.fx.traceback import NodeSource

import fxpass as fp
from fxpass.html import GraphRecorder, HtmlReport, diff_graphs, render_html

aten = torch.ops.aten


def test_what_a_pass_changed():
    gm = tiny_gm()
    n = len(planted_passes.candidates(gm))
    rec = GraphRecorder()
    fp.Pipeline.parse("cse,planted_passes:add_as_sub_neg").run(gm, instrument=[rec])
    names = [c.name for c in rec.changes]
    assert names == ["cse", "add_as_sub_neg"]
    change = rec.changes[1]
    assert change.removed == n  # every tensor add is gone
    assert change.added == 2 * n - 1  # a sub and a neg for each, but one lost its neg
    assert change.changed == 0 and change.rewired > 0
    assert sum(h.like_it for h in change.hunks) == change.hunks_total
    hunk = change.hunks[0]
    before, after = hunk.text()
    assert any("add.Tensor" in line for line in before)
    assert any("sub.Tensor" in line for line in after)
    statuses = {st for _, st, _, _ in hunk.after.nodes}
    assert {"new", "context"} <= statuses


def test_fixpoint_rounds_that_changed_nothing_are_not_summarized(monkeypatch):
    from fxpass.html import capture

    gm = tiny_gm()
    calls = []
    real = capture.summarize
    monkeypatch.setattr(capture, "summarize", lambda g: calls.append(1) or real(g))
    rec = GraphRecorder()
    fp.Pipeline([fp.fixpoint("cse")]).run(gm, instrument=[rec])
    # before the run, after round 1 (changed); round 2 changed nothing and is skipped
    assert len(calls) == 2
    assert [c.name for c in rec.changes] == ["cse"]


def test_nodes_are_matched_by_provenance():
    """A node re-created under a new name (an interpreter pass) is the same node."""
    gm = tiny_gm()
    before = copy.deepcopy(gm)
    old = next(n for n in gm.graph.nodes if n.target is aten.mm.default)
    with gm.graph.inserting_before(old):
        new = gm.graph.call_function(old.target, old.args)
    new.meta.update(old.meta)
    new.meta["from_node"] = [NodeSource(old, "rebuild")]
    old.replace_all_uses_with(new)
    gm.graph.erase_node(old)
    change = diff_graphs(before, gm)
    assert (change.added, change.removed, change.changed, change.rewired) == (0, 0, 0, 0)
    assert change.hunks == []


def test_fused_node_shares_a_region_with_what_it_replaced():
    gm = big_graph(6)
    before = copy.deepcopy(gm)
    fuse_mul_relu(every=100)(gm)
    change = diff_graphs(before, gm)
    assert (change.added, change.removed, change.hunks_total) == (1, 2, 1)
    hunk = change.hunks[0]
    removed = [name for name, st, _, _ in hunk.before.nodes if st == "removed"]
    new = [d for _, st, _, d in hunk.after.nodes if st == "new"]
    assert removed == ["mul_tensor", "relu_default"]
    assert new[0]["provenance"]["replaced"] == removed
    assert new[0]["from_node"] == removed


def test_16k_node_graph_draws_only_the_changed_regions(tmp_path):
    gm = big_graph(4000)
    assert len(gm.graph.nodes) > 16000
    report = HtmlReport(tmp_path / "big.html", max_hunks=5)
    fp.Pipeline([fuse_mul_relu(every=40)]).run(gm, instrument=[report])
    (change,) = report.changes
    assert change.hunks_total == 100 and change.removed == 200
    assert len(change.hunks) == 1 and change.hunks[0].like_it == 100  # alike: drawn once
    drawn = sum(len(h.before.nodes) + len(h.after.nodes) for h in change.hunks)
    assert drawn < 20
    page = (tmp_path / "big.html").read_text()
    assert len(page) < 60_000
    assert "and 99 more like it" in page
    assert report._last is None  # nothing of the graph is kept after the run


def test_distinct_regions_are_capped(tmp_path):
    gm = tiny_gm()
    rec = GraphRecorder(max_hunks=2, max_nodes=5)
    fp.Pipeline.parse("planted_passes:add_as_sub_neg").run(gm, instrument=[rec])
    (change,) = rec.changes
    assert len(change.hunks) == 2 < change.hunks_total
    big = max(change.hunks, key=lambda h: h.after.truncated)
    assert big.after.truncated > 0
    page = render_html(None, rec.changes)
    assert "more nodes not drawn" in page and "distinct ones drawn" in page


def test_touching_rewrites_are_separate_regions():
    """Fused ops that feed each other (the residual stream) are drawn as separate regions."""
    g = torch.fx.Graph()
    h = g.placeholder("x")
    for _ in range(5):
        h = g.call_function(aten.relu.default, (h,))
    g.output((h,))
    gm = torch.fx.GraphModule(torch.nn.Module(), g)
    before = copy.deepcopy(gm)
    for node in [n for n in gm.graph.nodes if n.target is aten.relu.default]:
        with gm.graph.inserting_before(node):
            fused = gm.graph.call_function(aten.clamp_min.default, (node.args[0], 0.0))
            item = gm.graph.call_function(operator.getitem, ((fused,), 0))
        fused.meta["fxpass_provenance"] = {"rule": "relu", "replaced": [node.name]}
        node.replace_all_uses_with(item)
        gm.graph.erase_node(node)
    change = diff_graphs(before, gm)
    assert change.hunks_total == 5
    assert sum(h.like_it for h in change.hunks) == 5  # the last one also rewires the output
    assert max(h.like_it for h in change.hunks) == 4


def test_each_fusion_is_its_own_region_matched_by_provenance():
    """With the rewrite engine's provenance, one fused add+norm is one picture."""
    gm = tiny_gm()
    rec = GraphRecorder()
    fp.Pipeline.parse("remove_assert_ops,fuse_add_rmsnorm").run(gm, instrument=[rec])
    change = next(c for c in rec.changes if c.name == "fuse_add_rmsnorm")
    fused = [n for n in gm.graph.nodes if "fused_add_rmsnorm" in str(n.target)]
    assert len(fused) >= 2 and change.hunks_total == len(fused)
    for hunk in change.hunks:
        (new,) = [d for _, st, _, d in hunk.after.nodes if st == "new" and "fxpass." in d["target"]]
        removed = {name for name, st, _, _ in hunk.before.nodes if st == "removed"}
        assert removed == set(new["provenance"]["replaced"])
        assert new["provenance"]["pass"] == "fuse_add_rmsnorm"


def test_a_library_pass_that_edits_through_the_editor_draws_each_fusion_with_what_it_replaced():
    """partition's calls and their getitems carry the editor's provenance, naming the nodes
    they replaced (the change list draws a node with what it replaced)."""
    gm = tiny_gm()
    rec = GraphRecorder()
    spec = 'remove_assert_ops,partition{support="elementwise"}'
    fp.Pipeline.parse(spec).run(gm, instrument=[rec])
    change = next(c for c in rec.changes if c.name == "partition")
    assert change.added and change.removed
    removed = {n for h in change.hunks for n, st, _, _ in h.before.nodes if st == "removed"}
    new = [d for h in change.hunks for _, st, _, d in h.after.nodes if st == "new"]
    assert any(d["target"].startswith("fused_") for d in new)
    for d in new:
        assert d["provenance"]["pass"] == "partition"
        assert d["from_node"] and set(d["provenance"]["replaced"]) <= removed
