"""A layered (Sugiyama-style) layout for small DAGs, in plain Python: no graphviz.

Data flows top to bottom. Nodes get a layer by longest path from the sources; edges that
skip layers get dummy points so they bend around the nodes in between; nodes in a layer are
ordered by the barycenter heuristic (a few sweeps down and up) to reduce crossings; then x
positions are pulled towards the nodes they connect to while keeping their order and gaps.
The pictures fxpass draws are changed regions (tens of nodes), so simple and quadratic is fine.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["Layout", "layered_layout"]

H_GAP = 18.0
V_GAP = 34.0
DUMMY_W = 8.0
MARGIN = 12.0


@dataclass
class Layout:
    """Node centres, edge routes (lists of points) and the drawing's size."""

    pos: dict[str, tuple[float, float]] = field(default_factory=dict)
    routes: dict[tuple[str, str], list[tuple[float, float]]] = field(default_factory=dict)
    width: float = 0.0
    height: float = 0.0


def _layers(nodes: Sequence[str], edges: Sequence[tuple[str, str]]) -> dict[str, int]:
    index = {n: i for i, n in enumerate(nodes)}
    preds: dict[str, list[str]] = {n: [] for n in nodes}
    for a, b in edges:
        if index[a] < index[b]:  # graph order is topological; ignore anything else
            preds[b].append(a)
    layer: dict[str, int] = {}
    for n in nodes:
        layer[n] = 1 + max((layer[p] for p in preds[n]), default=-1)
    return layer


def layered_layout(
    nodes: Sequence[str],
    edges: Sequence[tuple[str, str]],
    sizes: dict[str, tuple[float, float]],
) -> Layout:
    """Lay out ``nodes`` (in topological order) with ``edges`` (src, dst); ``sizes`` (w, h)."""
    if not nodes:
        return Layout(width=2 * MARGIN, height=2 * MARGIN)
    layer = _layers(nodes, edges)
    depth = max(layer.values()) + 1
    rows: list[list[str]] = [[] for _ in range(depth)]
    for n in nodes:
        rows[layer[n]].append(n)
    width = {n: sizes[n][0] for n in nodes}
    # Dummy points split long edges into one-layer steps.
    chains: dict[tuple[str, str], list[str]] = {}
    up: dict[str, list[str]] = {n: [] for n in nodes}
    down: dict[str, list[str]] = {n: [] for n in nodes}
    for a, b in edges:
        if layer[a] >= layer[b]:
            continue
        chain = [a]
        for k in range(layer[a] + 1, layer[b]):
            d = f"\0{a}\0{b}\0{k}"
            rows[k].append(d)
            width[d] = DUMMY_W
            up[d], down[d] = [], []
            chain.append(d)
        chain.append(b)
        for x, y in itertools.pairwise(chain):
            down[x].append(y)
            up[y].append(x)
        chains[(a, b)] = chain
    _order(rows, up, down)
    x = _place(rows, width, up, down)
    row_h = [max((sizes[n][1] for n in row if n in sizes), default=0.0) for row in rows]
    y_top, y = [], MARGIN
    for h in row_h:
        y_top.append(y)
        y += h + V_GAP
    out = Layout()
    for k, row in enumerate(rows):
        for n in row:
            out.pos[n] = (x[n], y_top[k] + row_h[k] / 2)
    left = min(x[n] - width[n] / 2 for n in x)
    shift = MARGIN - left
    out.pos = {n: (px + shift, py) for n, (px, py) in out.pos.items()}
    for (a, b), chain in chains.items():
        pts = [out.pos[a][0], out.pos[a][1] + sizes[a][1] / 2]
        route = [(pts[0], pts[1])]
        route += [out.pos[d] for d in chain[1:-1]]
        route.append((out.pos[b][0], out.pos[b][1] - sizes[b][1] / 2))
        out.routes[(a, b)] = route
    for d in [n for n in out.pos if n.startswith("\0")]:
        del out.pos[d]
    out.width = max(px + width[n] / 2 for n, (px, _) in out.pos.items()) + MARGIN
    out.height = y - V_GAP + MARGIN
    return out


def _order(rows: list[list[str]], up: dict, down: dict, sweeps: int = 4) -> None:
    """Barycenter ordering: sort each layer by the mean position of its neighbours."""

    def sort_by(row: list[str], ref: list[str], links: dict) -> None:
        where = {n: i for i, n in enumerate(ref)}
        current = {n: i for i, n in enumerate(row)}

        def key(n: str) -> float:
            ps = [where[p] for p in links[n] if p in where]
            return sum(ps) / len(ps) if ps else current[n]

        row.sort(key=key)

    for _ in range(sweeps):
        for k in range(1, len(rows)):
            sort_by(rows[k], rows[k - 1], up)
        for k in range(len(rows) - 2, -1, -1):
            sort_by(rows[k], rows[k + 1], down)
    for k in range(1, len(rows)):
        sort_by(rows[k], rows[k - 1], up)


def _place(rows: list[list[str]], width: dict, up: dict, down: dict) -> dict[str, float]:
    """x centres: packed left to right, then pulled towards neighbours, keeping order."""
    x: dict[str, float] = {}
    for row in rows:
        cursor = 0.0
        for n in row:
            x[n] = cursor + width[n] / 2
            cursor += width[n] + H_GAP
    for _ in range(3):
        for k in range(1, len(rows)):
            _pull(rows[k], width, x, up)
        for k in range(len(rows) - 2, -1, -1):
            _pull(rows[k], width, x, down)
    return x


def _pull(row: list[str], width: dict, x: dict, links: dict) -> None:
    want = []
    for n in row:
        ps = [x[p] for p in links[n] if p in x]
        want.append(sum(ps) / len(ps) if ps else x[n])
    # Left to right: as close to the wish as the left neighbour allows.
    placed: list[float] = []
    for i, n in enumerate(row):
        lo = placed[-1] + (width[row[i - 1]] + width[n]) / 2 + H_GAP if placed else -1e18
        placed.append(max(want[i], lo))
    # Right to left: pull back nodes pushed right of their wish, where there is room.
    for i in range(len(row) - 2, -1, -1):
        hi = placed[i + 1] - (width[row[i]] + width[row[i + 1]]) / 2 - H_GAP
        placed[i] = min(placed[i], hi)
    for n, px in zip(row, placed):
        x[n] = px
