"""The self-contained HTML report: one file, inline CSS and JS, no server, no network.

It shows the pipeline summary (per-pass time, changes, node counts, statistics), the
numerics checks when there were any, and for each pass that changed the graph a picture of
each changed region before and after. Pictures fit the page's width, so a whole region is
seen without scrolling inside a pane: before and after side by side when both are readable
that way, else one above the other. Hovering a node shows its op, shape, dtype and
provenance in a tooltip and in the side panel (which folds away to give the pictures the
whole width), and lights up the same node (or the nodes it replaced) in the other picture.

The page is a list of sections (header, passes, numerics, changes), each built by one
function from the report's data; a new kind of section adds one function and one entry.
"""

from __future__ import annotations

import datetime as _dt
import html
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..fxutil.files import write_atomic
from .capture import Hunk, PassChange
from .lanes import render_lanes
from .svg import render_svg

__all__ = ["render_html", "write_html"]

_CSS = """
:root{--new:#1e8e3e;--new-bg:#e6f4ea;--rm:#d93025;--rm-bg:#fce8e6;--ch:#e37400;--ch-bg:#fef7e0;
--ctx:#9aa0a6;--ctx-bg:#f8f9fa;--ink:#202124;--mute:#5f6368;--line:#dadce0}
*{box-sizing:border-box}
body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;color:var(--ink);
background:#fff}
main{margin-right:340px;padding:16px 24px;transition:margin-right .15s}
body.panel-closed main{margin-right:44px}
h1{font-size:20px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid
var(--line);padding-bottom:4px}h3{font-size:15px;margin:18px 0 6px}
code,.mono,pre{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12px}
.sub{color:var(--mute)}
table{border-collapse:collapse;margin:8px 0}th,td{padding:3px 10px;border-bottom:1px solid
var(--line);text-align:left;vertical-align:top}th{background:#f1f3f4;font-weight:600}
td.num{text-align:right;font-variant-numeric:tabular-nums}
.bar{display:inline-block;height:8px;background:#8ab4f8;border-radius:2px;vertical-align:middle}
.badge{display:inline-block;padding:0 6px;border-radius:8px;font-size:12px;margin-right:4px}
.b-new{background:var(--new-bg);color:var(--new)}.b-removed{background:var(--rm-bg);color:var(--rm)}
.b-changed,.b-rewired{background:var(--ch-bg);color:var(--ch)}
.ok{color:var(--new)}.bad{color:var(--rm);font-weight:600}.failed{color:var(--rm)}
.hunk{border:1px solid var(--line);border-radius:6px;margin:10px 0;padding:6px 10px}
.sides{display:grid;grid-template-columns:1fr 1fr;gap:12px}
.sides.stacked{grid-template-columns:1fr}
.side{min-width:0;border:1px solid #eee;border-radius:4px;background:#fff}
.side h4{margin:0;padding:4px 8px;font-size:12px;color:var(--mute);background:#f8f9fa}
svg.graph{display:block;width:100%;height:auto;margin:0 auto}
.side h4 button{float:right;border:0;background:none;color:#1a73e8;cursor:pointer;font:inherit}
.side.natural{overflow:auto;max-height:90vh}
.side.natural svg.graph{width:auto;max-width:none!important}
svg .node rect{stroke-width:1.5;fill:var(--ctx-bg);stroke:var(--ctx)}
svg .node.context rect{stroke-dasharray:3 2}
svg .node.context text{fill:var(--mute)}
svg .node.new rect{fill:var(--new-bg);stroke:var(--new)}
svg .node.removed rect{fill:var(--rm-bg);stroke:var(--rm)}
svg .node.changed rect{fill:var(--ch-bg);stroke:var(--ch)}
svg .node.rewired rect{fill:#fff;stroke:var(--ch)}
svg .node{cursor:pointer}svg .node:hover rect,svg .node.peer rect,svg .node:focus rect{
stroke-width:3}
svg .node.peer rect{stroke:#1a73e8}
svg text{font:11px ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;text-anchor:middle}
svg text.name{font-weight:600}svg text.type{fill:var(--mute)}
svg .edge{fill:none;stroke:#b0b4b9;stroke-width:1.2}svg .edge.hot{stroke:#5f6368}
svg .arrowhead{fill:#80868b}
aside{position:fixed;top:0;right:0;width:330px;height:100vh;overflow:auto;border-left:1px solid
var(--line);background:#fafafa;padding:12px 14px;transition:width .15s}
aside header{display:flex;align-items:center;gap:8px}
aside h2{margin:0;flex:1;border:0}
#panel-toggle{border:1px solid var(--line);background:#fff;border-radius:4px;cursor:pointer;
font:inherit;font-size:12px;padding:2px 8px}
body.panel-closed aside{width:36px;padding:12px 4px;overflow:hidden}
body.panel-closed aside h2,body.panel-closed #panel-body{display:none}
body.panel-closed #panel-toggle{writing-mode:vertical-rl;padding:8px 2px}aside dt{font-weight:600;margin-top:6px;font-size:12px;color:var(--mute)}
aside dd{margin:0;word-break:break-word}
.legend span{margin-right:10px}
details>summary{cursor:pointer}
"""

_JS = """
(function () {
  "use strict";
  var blob = document.getElementById("fxpass-nodes");
  var data = blob ? JSON.parse(blob.textContent) : {};
  var body = document.getElementById("panel-body");
  var lit = [];
  function field(dl, label, value) {
    if (value === undefined || value === null || value === "") return;
    var dt = document.createElement("dt"); dt.textContent = label;
    var dd = document.createElement("dd");
    dd.textContent = Array.isArray(value) ? value.join(", ") : String(value);
    if (label === "code" || label === "target") dd.className = "mono";
    dl.appendChild(dt); dl.appendChild(dd);
  }
  function show(id) {
    var d = data[id];
    if (!d || !body) return;
    body.textContent = "";
    var dl = document.createElement("dl");
    field(dl, "node", d.name); field(dl, "status", d.status); field(dl, "type", d.type);
    field(dl, "op", d.op); field(dl, "target", d.target); field(dl, "code", d.code);
    var p = d.provenance || {};
    field(dl, "rule", p.rule); field(dl, "made by pass", p.pass);
    field(dl, "replaced", p.replaced); field(dl, "rule written at", p.location);
    field(dl, "from nodes", d.from_node); field(dl, "module", d.module);
    field(dl, "source", d.stack);
    body.appendChild(dl);
  }
  function peers(g) {
    var id = g.getAttribute("data-id"), cut = id.indexOf(":");
    var pic = id.slice(0, cut), name = id.slice(cut + 1);
    var other = pic.slice(0, -1) + (pic.slice(-1) === "b" ? "a" : "b");
    var d = data[id] || {};
    var names = [name].concat(d.from_node || []);
    var out = [];
    names.forEach(function (n) {
      var el = document.querySelector('g.node[data-id="' + CSS.escape(other + ":" + n) + '"]');
      if (el) out.push(el);
    });
    return out;
  }
  function light(g) {
    lit.forEach(function (el) { el.classList.remove("peer"); });
    lit = peers(g);
    lit.forEach(function (el) { el.classList.add("peer"); });
  }
  var toggle = document.getElementById("panel-toggle");
  function panel(open) {
    document.body.classList.toggle("panel-closed", !open);
    if (toggle) {
      toggle.setAttribute("aria-expanded", String(open));
      toggle.textContent = open ? "hide \u25b8" : "\u25c2 node";
    }
    fit();
  }
  // Before and after side by side while both fit at a readable scale, else one above the
  // other: a whole region is always seen without scrolling inside a pane.
  function fit() {
    document.querySelectorAll(".sides").forEach(function (sides) {
      sides.classList.remove("stacked");
      var half = sides.clientWidth / 2;
      var widest = 0;
      sides.querySelectorAll("svg.graph").forEach(function (svg) {
        widest = Math.max(widest, Number(svg.getAttribute("data-width")) || 0);
      });
      if (widest > half * 1.4) sides.classList.add("stacked");
    });
    document.querySelectorAll(".side").forEach(function (side) {
      var svg = side.querySelector("svg.graph"), b = side.querySelector("button.zoom");
      if (!svg || !b || side.classList.contains("natural")) return;
      b.hidden = svg.getBoundingClientRect().width >= Number(svg.getAttribute("data-width")) - 1;
    });
  }
  if (toggle) toggle.addEventListener("click", function () {
    panel(document.body.classList.contains("panel-closed"));
  });
  document.querySelectorAll("g.node").forEach(function (g) {
    var go = function () { show(g.getAttribute("data-id")); light(g); };
    g.addEventListener("mouseenter", go);
    g.addEventListener("focus", go);
    g.addEventListener("click", function () { go(); panel(true); });
  });
  // A picture shrunk to fit can be seen at the size it was drawn (then its pane scrolls).
  document.querySelectorAll("button.zoom").forEach(function (b) {
    b.addEventListener("click", function () {
      var natural = b.closest(".side").classList.toggle("natural");
      b.textContent = natural ? "fit to width" : "actual size";
    });
  });
  window.addEventListener("resize", fit);
  panel(window.innerWidth >= 1100);
})();
"""


def _e(text: Any) -> str:
    return html.escape(str(text))


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f}"


def _fmt(v: Any) -> str:
    return str(int(v)) if isinstance(v, (int, float)) and float(v).is_integer() else f"{v:.3g}"


def _summary_table(report: Any, anchors: dict[str, str]) -> str:
    root = report.root
    total = root.seconds or 1e-12
    rows = []
    for depth, rec in root.walk():
        if depth == 0:
            continue
        pct = 100 * rec.seconds / total
        delta = rec.nodes_after - rec.nodes_before
        name = _e(rec.name) + (f' <span class="sub">x{rec.runs}</span>' if rec.runs > 1 else "")
        if rec.name in anchors and not rec.children:
            name = f'<a href="#{anchors[rec.name]}">{name}</a>'
        status = "" if rec.status == "ok" else f' <span class="failed">[{_e(rec.status)}]</span>'
        stats = ", ".join(f"{_e(k)}={_e(_fmt(v))}" for k, v in rec.stats.items())
        notes = "; ".join([*rec.notes, *([rec.error] if rec.error else [])])
        rows.append(
            f"<tr><td style='padding-left:{8 + 16 * (depth - 1)}px'>{name}{status}</td>"
            f"<td>{'yes' if rec.modified else '-'}</td>"
            f"<td class='num'>{_ms(rec.seconds)}</td>"
            f"<td><span class='bar' style='width:{max(pct, 0.5):.1f}px'></span> {pct:.1f}%</td>"
            f"<td class='num'>{delta:+d}</td><td>{stats}</td><td class='sub'>{_e(notes)}</td></tr>"
        )
    head = (
        "<tr><th>pass</th><th>changed</th><th>ms</th><th>time</th><th>nodes</th>"
        "<th>statistics</th><th>notes</th></tr>"
    )
    return f"<table id='passes'>{head}{''.join(rows)}</table>"


def _numerics_section(results: Sequence[Any], final: Any) -> str:
    parts = ["<h2 id='numerics'>Numerics</h2>"]
    if final is not None:
        cls = "ok" if final.ok else "bad"
        word = "match" if final.ok else "differ"
        parts.append(
            f"<p>Final outputs against the original: <span class='{cls}'>{word}</span> "
            f"&mdash; {_e(final.summary())}</p>"
        )
    if results:
        first = next((r for r in results if not r.ok), None)
        if first is not None:
            parts.append(f"<p class='bad'>First pass whose outputs diverge: {_e(first.name)}</p>")
        rows = []
        for r in results:
            c = r.comparison
            where = _e(c.worst) if c.worst else ""
            rows.append(
                f"<tr><td>{_e(r.spec or r.name)}</td>"
                f"<td class='{'ok' if r.ok else 'bad'}'>{'ok' if r.ok else 'diverges'}</td>"
                f"<td class='num'>{c.max_abs_error:.3g}</td>"
                f"<td class='num'>{c.max_rel_error:.3g}</td><td class='mono'>{where}</td></tr>"
            )
        parts.append(
            "<table><tr><th>after pass</th><th>outputs</th><th>max abs error</th>"
            f"<th>max rel error</th><th>worst element</th></tr>{''.join(rows)}</table>"
        )
    return "".join(parts)


def _hunk_html(hunk: Hunk, prefix: str, details: dict[str, Any], number: int) -> str:
    more = f" &mdash; and {hunk.like_it - 1} more like it" if hunk.like_it > 1 else ""
    badges = "".join(
        f"<span class='badge b-{k}'>{v} {k}</span>" for k, v in hunk.counts.items() if v
    )
    sides = []
    for tag, title, sub in (("b", "before", hunk.before), ("a", "after", hunk.after)):
        note = f" ({sub.truncated} more nodes not drawn)" if sub.truncated else ""
        svg = render_svg(sub, f"{prefix}{tag}", details) if sub.nodes else "<p class='sub'>-</p>"
        zoom = "<button type='button' class='zoom'>actual size</button>" if sub.nodes else ""
        sides.append(f"<div class='side'><h4>{title}{note}{zoom}</h4>{svg}</div>")
    return (
        f"<div class='hunk'><div>region {number}{more} {badges}</div>"
        f"<div class='sides'>{''.join(sides)}</div></div>"
    )


def _change_html(change: PassChange, index: int, details: dict[str, Any]) -> str:
    counts = "".join(
        f"<span class='badge b-{k}'>{v} {k}</span>"
        for k, v in (
            ("new", change.added),
            ("removed", change.removed),
            ("changed", change.changed),
            ("rewired", change.rewired),
        )
        if v
    )
    shown = len(change.hunks)
    like = sum(h.like_it for h in change.hunks)
    note = f"{change.hunks_total} changed regions"
    if shown < change.hunks_total:
        note += f"; {shown} distinct ones drawn"
        if like < change.hunks_total:
            note += f" ({change.hunks_total - like} others not drawn)"
    hunks = "".join(
        _hunk_html(h, f"p{index}h{j}", details, j + 1) for j, h in enumerate(change.hunks)
    )
    return (
        f"<section class='change' id='change-{index}'><h3>{_e(change.label)}</h3>"
        f"<div>{counts} <span class='sub'>nodes {change.nodes_before} &rarr; "
        f"{change.nodes_after}; {note}</span></div>{hunks}</section>"
    )


def _header_section(report: Any, title: str, info: dict[str, Any] | None) -> str:
    facts = dict(info or {})
    if report is not None:
        root = report.root
        facts.setdefault("pipeline", report.spec or root.name)
        facts["time"] = f"{root.seconds * 1e3:.1f} ms"
        facts["nodes"] = f"{root.nodes_before} → {root.nodes_after}"
        facts["changed"] = "yes" if report.modified else "no"
        if report.error:
            facts["error"] = report.error
    facts["generated"] = _dt.datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    rows = "".join(
        f"<tr><th>{_e(k)}</th><td class='mono'>{_e(v)}</td></tr>" for k, v in facts.items()
    )
    return f"<h1>{_e(title)}</h1><table class='facts'>{rows}</table>"


def _passes_section(report: Any, anchors: dict[str, str]) -> str:
    if report is None:
        return ""
    suppressed = "".join(f"<p class='failed'>suppressed: {_e(s)}</p>" for s in report.suppressed)
    return "<h2 id='summary'>Passes</h2>" + _summary_table(report, anchors) + suppressed


def _changes_section(changes: Sequence[PassChange], details: dict[str, Any]) -> str:
    legend = (
        "<h2 id='changes'>Changes</h2><p class='legend'>"
        "<span class='badge b-new'>new</span><span class='badge b-removed'>removed</span>"
        "<span class='badge b-changed'>changed</span><span class='badge b-rewired'>rewired "
        "(same op, new inputs)</span><span class='sub'>grey, dashed: neighbours for context; "
        "hover a node for its details</span></p>"
    )
    if not changes:
        return legend + "<p class='sub'>No pass changed the graph.</p>"
    return legend + "".join(_change_html(ch, i, details) for i, ch in enumerate(changes))


def render_html(
    report: Any = None,
    changes: Sequence[PassChange] = (),
    *,
    title: str = "fxpass report",
    numerics: Sequence[Any] = (),
    final_numerics: Any = None,
    info: dict[str, Any] | None = None,
    lanes: Any = None,
) -> str:
    """The report as one HTML document (a string).

    ``report`` is a run's :class:`~fxpass.Report`, ``changes`` the
    :attr:`GraphRecorder.changes <fxpass.html.GraphRecorder.changes>`, ``numerics`` the
    :attr:`NumericsCheck.results <fxpass.verify.NumericsCheck.results>`, ``final_numerics``
    a :class:`~fxpass.verify.Comparison` of the final outputs, ``info`` extra key/values for
    the header (target, command, ...), ``lanes`` the streams of the final graph
    (:func:`~fxpass.html.stream_lanes`) when it has stream ops.
    """
    details: dict[str, Any] = {}
    anchors: dict[str, str] = {}
    for i, ch in enumerate(changes):
        anchors.setdefault(ch.name, f"change-{i}")
    body = [
        _header_section(report, title, info),
        _passes_section(report, anchors),
        _numerics_section(numerics, final_numerics)
        if numerics or final_numerics is not None  # a Comparison is falsy when it failed
        else "",
        render_lanes(lanes) if lanes is not None else "",
        _changes_section(changes, details),
    ]
    blob = (  # no "<" at all inside the script element: nothing can close or open a tag
        json.dumps(details, default=str)
        .replace("&", "\\u0026")
        .replace("<", "\\u003c")
        .replace(">", "\\u003e")
    )
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>"
        f"<main>{''.join(body)}</main>"
        "<aside id='panel'><header><h2>Node</h2><button id='panel-toggle' type='button' "
        "aria-controls='panel-body' aria-expanded='true'>hide &#9656;</button></header>"
        "<div id='panel-body' class='sub'>Hover or click a node in a picture to see its "
        "details here.</div></aside>"
        f"<script type='application/json' id='fxpass-nodes'>{blob}</script>"
        f"<script>{_JS}</script></body></html>"
    )


def write_html(path: str | os.PathLike, document: str) -> Path:
    """Write ``document`` to ``path`` atomically (a temporary file renamed into place)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_atomic(path, document)
