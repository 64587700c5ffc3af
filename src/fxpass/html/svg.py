"""Draw one side of a changed region as an inline SVG picture.

Each node is a box with its name, op and type (shape and dtype); its status picks the
colours: ``new`` (green), ``removed`` (red), ``changed`` (amber), ``rewired`` (amber outline:
same op, new inputs) and ``context`` (grey, the neighbourhood drawn for orientation). The
full details of each node sit in the page's JSON blob under the node's ``data-id``; hovering
shows them in a tooltip and in the side panel.
"""

from __future__ import annotations

import html
from typing import Any

from .capture import SubGraph
from .dag_layout import layered_layout

__all__ = ["node_size", "render_svg"]

CHAR_W = 6.6
LINE_H = 14.0
PAD_X = 8.0
PAD_Y = 6.0


def node_size(lines: list[str]) -> tuple[float, float]:
    longest = max((len(s) for s in lines), default=1)
    return longest * CHAR_W + 2 * PAD_X, len(lines) * LINE_H + 2 * PAD_Y


def _tooltip(d: dict[str, Any]) -> str:
    parts = [d["code"]]
    if d.get("type"):
        parts.append(f"type: {d['type']}")
    if d.get("from_node"):
        parts.append(f"from: {', '.join(d['from_node'])}")
    prov = d.get("provenance")
    if prov and prov.get("rule"):
        parts.append(f"rule: {prov['rule']}")
    parts.append(f"status: {d['status']}")
    return "\n".join(parts)


def _path(points: list[tuple[float, float]]) -> str:
    (x0, y0), rest = points[0], points[1:]
    out = [f"M{x0:.1f},{y0:.1f}"]
    px, py = x0, y0
    for x, y in rest:
        my = (py + y) / 2
        out.append(f"C{px:.1f},{my:.1f} {x:.1f},{my:.1f} {x:.1f},{y:.1f}")
        px, py = x, y
    return " ".join(out)


def render_svg(sub: SubGraph, prefix: str, details: dict[str, dict[str, Any]]) -> str:
    """SVG markup for ``sub``; node details are added to ``details`` under ``prefix:name``.

    The picture scales down to the width of what holds it (never up), so a whole region is
    seen at once; ``data-width`` keeps its natural width."""
    names = [n for n, _, _, _ in sub.nodes]
    sizes = {n: node_size(lines) for n, _, lines, _ in sub.nodes}
    status = {n: st for n, st, _, _ in sub.nodes}
    layout = layered_layout(names, sub.edges, sizes)
    w, h = max(layout.width, 60.0), max(layout.height, 30.0)
    marker = f"{prefix}-arrow"
    out = [
        # Fit to the pane's width (never wider than drawn): the whole region, no scrolling.
        f'<svg class="graph" xmlns="http://www.w3.org/2000/svg" width="{w:.0f}" '
        f'height="{h:.0f}" viewBox="0 0 {w:.0f} {h:.0f}" role="img" '
        f'style="max-width:{w:.0f}px" data-width="{w:.0f}">',
        f'<defs><marker id="{marker}" viewBox="0 0 10 10" refX="9" refY="5" '
        'markerWidth="7" markerHeight="7" orient="auto-start-reverse">'
        '<path d="M0,0 L10,5 L0,10 z" class="arrowhead"/></marker></defs>',
    ]
    for (a, b), route in layout.routes.items():
        hot = {status.get(a), status.get(b)} & {"new", "removed", "changed"}
        cls = "edge hot" if hot else "edge"
        out.append(f'<path class="{cls}" d="{_path(route)}" marker-end="url(#{marker})"/>')
    for n, st, lines, d in sub.nodes:
        x, y = layout.pos[n]
        bw, bh = sizes[n]
        key = f"{prefix}:{n}"
        details[key] = d
        out.append(
            f'<g class="node {st}" data-id="{html.escape(key)}" tabindex="0">'
            f"<title>{html.escape(_tooltip(d))}</title>"
            f'<rect x="{x - bw / 2:.1f}" y="{y - bh / 2:.1f}" width="{bw:.1f}" '
            f'height="{bh:.1f}" rx="4"/>'
        )
        for i, line in enumerate(lines):
            ty = y - bh / 2 + PAD_Y + LINE_H * (i + 0.78)
            cls = ("name", "op", "type")[min(i, 2)]
            out.append(f'<text x="{x:.1f}" y="{ty:.1f}" class="{cls}">{html.escape(line)}</text>')
        out.append("</g>")
    out.append("</svg>")
    return "".join(out)
