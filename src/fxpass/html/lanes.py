"""The streams of a scheduled graph as lanes: one row per stream, the events between them.

For a graph with stream ops (:mod:`fxpass.ops.stream`) the report draws each stream as a
horizontal lane, in graph (issue) order from left to right: a bar for each run of kernels
on that stream, a dot where an event is recorded, a tick where a stream waits, and an arrow
from each record to the waits it serves. Hovering a bar lists its nodes. Unsafe spots that
:func:`fxpass.verify.check_streams` finds are listed under the picture.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx

from ..verify.stream_assignment import stream_assignment
from ..verify.streams import check_streams

__all__ = ["Lanes", "render_lanes", "stream_lanes"]

_FX = torch.ops.fxpass
_LANE_H = 34.0
_LEFT = 104.0
_TOP = 22.0
_MAX_WIDTH = 4000.0


@dataclass
class Lanes:
    """What the picture shows: kernel runs per stream, records, waits, and the arrows."""

    streams: list[int] = field(default_factory=list)
    runs: list[tuple[int, int, int, list[str]]] = field(default_factory=list)  # stream, from, to
    records: list[tuple[int, int, int, str]] = field(default_factory=list)  # step, stream, event
    waits: list[tuple[int, int, int, str]] = field(default_factory=list)
    arrows: list[tuple[int, int, int, int, int]] = field(default_factory=list)  # event + ends
    steps: int = 0
    problems: list[str] = field(default_factory=list)


def stream_lanes(gm: fx.GraphModule) -> Lanes | None:
    """The lanes of ``gm``, or None when it has no stream ops."""
    on = stream_assignment(gm)
    if not on.stream_ops:
        return None
    lanes = Lanes()
    step = 0
    run: list[Any] | None = None
    last_record: dict[int, tuple[int, int]] = {}
    for node in gm.graph.nodes:
        op = on.op(node)
        ints = on.numbers(node)
        if op is not None and ints is None:
            continue
        if op is _FX.set_stream.default:
            run = None
        elif op is _FX.record_event.default:
            event, stream = ints
            lanes.records.append((step, stream, event, node.name))
            last_record[event] = (step, stream)
            step, run = step + 1, None
        elif op is _FX.wait_event.default:
            event, stream = ints
            lanes.waits.append((step, stream, event, node.name))
            if event in last_record:
                lanes.arrows.append((event, *last_record[event], step, stream))
            step, run = step + 1, None
        elif on.is_kernel(node):
            if run is None or run[0] != on[node]:
                run = [on[node], step, step, []]
                lanes.runs.append(run)
            run[2] = step
            run[3].append(node.name)
            step += 1
    lanes.runs = [tuple(r) for r in lanes.runs]
    lanes.streams = list(on.streams)
    lanes.steps = step
    lanes.problems = [str(v) for v in check_streams(gm)]
    return lanes


def _svg(lanes: Lanes) -> str:
    unit = max(1.5, min(9.0, _MAX_WIDTH / max(lanes.steps, 1)))
    row = {s: i for i, s in enumerate(lanes.streams)}
    width = _LEFT + unit * (lanes.steps + 1) + 12
    height = _TOP + _LANE_H * len(lanes.streams) + 8

    def x(step: float) -> float:
        return _LEFT + unit * step

    def y(stream: int) -> float:
        return _TOP + _LANE_H * row[stream] + _LANE_H / 2

    out = [
        f'<svg class="lanes" xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" '
        f'height="{height:.0f}" viewBox="0 0 {width:.0f} {height:.0f}" role="img">'
    ]
    for s in lanes.streams:
        label = "stream 0 (main)" if s == 0 else f"stream {s}"
        out.append(
            f'<line class="lane" x1="{_LEFT:.1f}" x2="{width - 6:.1f}" y1="{y(s):.1f}" '
            f'y2="{y(s):.1f}"/><text class="lane-name" x="4" y="{y(s) + 4:.1f}">{label}</text>'
        )
    for stream, start, end, names in lanes.runs:
        more = f" ... {names[-1]}" if len(names) > 1 else ""
        tip = f"stream {stream}: {len(names)} kernels, {names[0]}{more}"
        out.append(
            f'<rect class="run s{row[stream] % 4}" x="{x(start):.1f}" y="{y(stream) - 9:.1f}" '
            f'width="{max(unit * (end - start + 1) - 1, 1.5):.1f}" height="18" rx="2">'
            f"<title>{html.escape(tip)}</title></rect>"
        )
    for event, s_step, s_stream, w_step, w_stream in lanes.arrows:
        out.append(
            f'<path class="sync" d="M{x(s_step) + unit / 2:.1f},{y(s_stream):.1f} '
            f'L{x(w_step) + unit / 2:.1f},{y(w_stream):.1f}"><title>event {event}</title></path>'
        )
    for step, stream, event, name in lanes.records:
        out.append(
            f'<circle class="record" cx="{x(step) + unit / 2:.1f}" cy="{y(stream):.1f}" r="4">'
            f"<title>{html.escape(f'{name}: record event {event} on stream {stream}')}</title>"
            "</circle>"
        )
    for step, stream, event, name in lanes.waits:
        out.append(
            f'<rect class="wait" x="{x(step) + unit / 2 - 2:.1f}" y="{y(stream) - 12:.1f}" '
            f'width="4" height="24"><title>'
            f"{html.escape(f'{name}: stream {stream} waits for event {event}')}</title></rect>"
        )
    out.append("</svg>")
    return "".join(out)


_STYLE = """<style>
svg.lanes .lane{stroke:#dadce0;stroke-width:1}svg.lanes text.lane-name{font:11px
system-ui,sans-serif;fill:#5f6368}svg.lanes .run{stroke:none}svg.lanes .s0{fill:#8ab4f8}
svg.lanes .s1{fill:#81c995}svg.lanes .s2{fill:#fdd663}svg.lanes .s3{fill:#f28b82}
svg.lanes .record{fill:#fff;stroke:#202124;stroke-width:1.5}svg.lanes .wait{fill:#202124}
svg.lanes .sync{stroke:#5f6368;stroke-width:1;fill:none;stroke-dasharray:3 2}
.lanes-box{overflow:auto;border:1px solid #eee;border-radius:4px;max-width:100%}
</style>"""


def render_lanes(lanes: Lanes) -> str:
    """The report section for ``lanes``: the picture and the checker's verdict."""
    kernels = sum(len(r[3]) for r in lanes.runs)
    side = sum(len(r[3]) for r in lanes.runs if r[0] != 0)
    facts = (
        f"{len(lanes.streams)} streams, {kernels} kernels ({side} on side streams), "
        f"{len(lanes.records)} events recorded, {len(lanes.waits)} waits"
    )
    if lanes.problems:
        items = "".join(f"<li>{html.escape(p)}</li>" for p in lanes.problems[:20])
        verdict = f"<p class='bad'>unsafe schedule:</p><ul>{items}</ul>"
    else:
        verdict = "<p class='ok'>check_streams: every cross-stream dependency is covered</p>"
    return (
        f"{_STYLE}<h2 id='streams'>Streams</h2><p class='sub'>{facts}; bars are runs of "
        "kernels in issue order, dots record an event, ticks wait for one</p>"
        f"<div class='lanes-box'>{_svg(lanes)}</div>{verdict}"
    )
