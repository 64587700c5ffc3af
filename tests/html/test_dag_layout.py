from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from fxpass.html.dag_layout import H_GAP, layered_layout


@st.composite
def dags(draw):
    n = draw(st.integers(1, 25))
    nodes = [f"n{i}" for i in range(n)]
    edges = draw(
        st.lists(
            st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)).filter(lambda e: e[0] < e[1]),
            max_size=40,
            unique=True,
        )
    )
    widths = draw(st.lists(st.floats(20, 200), min_size=n, max_size=n))
    sizes = {m: (w, 40.0) for m, w in zip(nodes, widths)}
    return nodes, [(nodes[a], nodes[b]) for a, b in edges], sizes


@settings(max_examples=60, deadline=None)
@given(dags())
def test_layers_flow_down_and_nodes_do_not_overlap(dag):
    nodes, edges, sizes = dag
    lay = layered_layout(nodes, edges, sizes)
    assert set(lay.pos) == set(nodes)
    for a, b in edges:
        assert lay.pos[b][1] > lay.pos[a][1]  # data flows downwards
        route = lay.routes[(a, b)]
        assert route[0][1] < route[-1][1]
    rows: dict[float, list[str]] = {}
    for n, (_, y) in lay.pos.items():
        rows.setdefault(y, []).append(n)
    for row in rows.values():
        row.sort(key=lambda n: lay.pos[n][0])
        for left, right in itertools.pairwise(row):
            gap = (lay.pos[right][0] - sizes[right][0] / 2) - (
                lay.pos[left][0] + sizes[left][0] / 2
            )
            assert gap >= H_GAP - 1e-6
    for n, (x, y) in lay.pos.items():
        assert x - sizes[n][0] / 2 >= 0 and x + sizes[n][0] / 2 <= lay.width + 1e-6
        assert y - sizes[n][1] / 2 >= 0 and y + sizes[n][1] / 2 <= lay.height + 1e-6


def test_a_chain_is_a_straight_line():
    nodes = ["a", "b", "c"]
    lay = layered_layout(nodes, [("a", "b"), ("b", "c")], {n: (50.0, 30.0) for n in nodes})
    xs = {round(lay.pos[n][0], 6) for n in nodes}
    assert len(xs) == 1
