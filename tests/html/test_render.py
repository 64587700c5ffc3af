from __future__ import annotations

import re

import planted_passes
import pytest
import torch
from _html_helpers import tiny_gm

import fxpass as fp
from fxpass.html import GraphRecorder, HtmlReport, render_html, write_html
from fxpass.verify import NumericsCheck

aten = torch.ops.aten


def _page(tmp_path) -> str:
    gm = tiny_gm()
    check = NumericsCheck()
    report = HtmlReport(tmp_path / "r.html", numerics=check, info={"target": "tiny"})
    fp.Pipeline.parse("cse,planted_passes:add_as_sub_neg,dce").run(gm, instrument=[check, report])
    return (tmp_path / "r.html").read_text()


def test_the_report_is_self_contained(tmp_path):
    page = _page(tmp_path)
    assert page.startswith("<!DOCTYPE html>")
    assert "<link" not in page and " src=" not in page and "@import" not in page
    urls = set(re.findall(r"https?://[^\s\"'<>)]+", page))
    assert urls <= {"http://www.w3.org/2000/svg"}  # the SVG namespace, never fetched
    assert page.count("<svg") >= 4
    assert "First pass whose outputs diverge: add_as_sub_neg" in page
    assert "merged=" in page  # cse's statistics in the summary table
    assert [p.name for p in tmp_path.iterdir()] == ["r.html"]  # no temporary file left


def test_text_from_the_graph_cannot_break_out(tmp_path):
    gm = tiny_gm()
    evil = "</script><script>alert(1)</script><b>"

    def tag(gm):
        for node in gm.graph.nodes:
            if node.target is aten.mm.default:
                with gm.graph.inserting_after(node):
                    new = gm.graph.call_function(aten.clone.default, (node,))
                new.meta["fxpass_provenance"] = {"rule": evil, "replaced": [node.name]}
                new.meta["stack_trace"] = evil
                node.replace_all_uses_with(new, delete_user_cb=lambda u, new=new: u is not new)
                return True
        return False

    rec = GraphRecorder()
    fp.Pipeline([tag]).run(gm, instrument=[rec])
    page = render_html(None, rec.changes)
    assert "<script>alert(1)" not in page and "<b>" not in page
    assert page.count("<script") == 2


def test_a_failed_run_still_writes_its_report(tmp_path):
    gm = tiny_gm()
    report = HtmlReport(tmp_path / "failed.html")
    with pytest.raises(fp.PassFailedError):
        fp.Pipeline.parse("cse,planted_passes:explode").run(gm, instrument=[report])
    page = (tmp_path / "failed.html").read_text()
    assert "planted failure in explode" in page and "[failed]" in page


def test_write_html_replaces_atomically(tmp_path):
    path = tmp_path / "sub" / "x.html"
    write_html(path, "one")
    write_html(path, "two")
    assert path.read_text() == "two"
    assert [p.name for p in path.parent.iterdir()] == ["x.html"]


def test_no_changes(tmp_path):
    page = render_html(None, [])
    assert "No pass changed the graph." in page
    assert planted_passes.RULE not in page
