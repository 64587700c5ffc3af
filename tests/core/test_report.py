"""Reports: every run returns one; it prints as a table and round-trips through JSON."""

from __future__ import annotations

import json

import torch

import fxpass as fp

aten = torch.ops.aten


def drop_asserts(gm):
    for n in list(gm.graph.nodes):
        if n.target is aten._assert_tensor_metadata.default:
            gm.graph.erase_node(n)
            fp.stat("erased")


def test_report_records_each_pass(llama_gm):
    before = len(llama_gm.graph.nodes)
    result = fp.Pipeline([drop_asserts, fp.fixpoint(lambda gm: None)]).run(llama_gm)
    report = result.report
    assert report.pass_names() == ["drop_asserts", "fixpoint", "<lambda>"]
    rec = report.find("drop_asserts")
    assert rec.modified and rec.runs == 1 and rec.seconds > 0
    assert rec.nodes_before == before and rec.nodes_after == before - rec.stats["erased"]
    assert report.stats()["drop_asserts.erased"] == rec.stats["erased"]
    assert report.root.nodes_before == before and report.modified


def test_report_prints_a_table(llama_gm):
    report = fp.Pipeline([drop_asserts]).run(llama_gm).report
    text = str(report)
    assert "drop_asserts" in text and "erased=" in text and "yes" in text
    assert "changed, nodes" in text


def test_report_json_round_trip(llama_gm):
    report = fp.Pipeline([drop_asserts, fp.fixpoint(drop_asserts)]).run(llama_gm).report
    data = json.loads(report.to_json())
    again = fp.Report.from_dict(data)
    assert again.to_dict() == report.to_dict()
    assert data["root"]["children"][1]["children"][0]["name"] == "drop_asserts"
