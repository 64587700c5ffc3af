"""The report's Streams section: a lane per stream, the events between them, the verdict."""

from __future__ import annotations

import torch
from _streams import original, scheduled

import fxpass as fp
from fxpass.html import HtmlReport, render_html, render_lanes, stream_lanes


def test_lanes_follow_the_schedule():
    gm, result = scheduled("moe")
    lanes = stream_lanes(gm)
    stats = result.report.root.children[0].stats
    assert lanes.streams == [0, 1]
    assert len(lanes.records) == stats["events"] and len(lanes.waits) == stats["waits"]
    assert len(lanes.arrows) == stats["waits"]  # every wait has its record
    side = [r for r in lanes.runs if r[0] == 1]
    assert sum(len(r[3]) for r in side) == stats["side_kernels"]
    assert lanes.problems == []
    html = render_lanes(lanes)
    assert html.count('<circle class="record"') == stats["events"]
    assert "stream 1" in html and "every cross-stream dependency is covered" in html


def test_no_section_without_streams_and_problems_listed_when_unsafe():
    gm, _ = original("moe")
    assert stream_lanes(gm) is None
    assert "id='streams'" not in render_html()
    unsafe, _ = scheduled("moe")
    wait = next(n for n in unsafe.graph.nodes if n.target is torch.ops.fxpass.wait_event.default)
    unsafe.graph.erase_node(wait)
    page = render_lanes(stream_lanes(unsafe))
    assert "unsafe schedule" in page and "missing_sync" in page


def test_report_of_a_run_with_multi_stream_shows_the_streams(tmp_path):
    gm, _ = original("parallel")
    report = HtmlReport(tmp_path / "r.html")
    fp.Pipeline.parse("multi_stream").run(gm, instrument=[report])
    page = (tmp_path / "r.html").read_text()
    assert "<h2 id='streams'>Streams</h2>" in page and 'class="lanes"' in page
