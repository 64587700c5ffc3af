"""AliasInfo: the memory facts the cleanup passes ask."""

from __future__ import annotations

import torch
from torch import fx

from fxpass.edit.alias import AliasInfo

aten = torch.ops.aten


def _graph():
    g = fx.Graph()
    x = g.placeholder("x")
    buf = g.call_function(aten.empty.memory_format, ([4],))
    view = g.call_function(aten.view.default, (buf, [2, 2]))
    store = g.call_function(aten.mul_.Tensor, (view, 2))
    read = g.call_function(aten.add.Tensor, (x, 1))
    g.output((read,))
    return g, buf, view, store, read


def test_last_read_is_the_last_user_of_any_alias():
    g, buf, view, store, read = _graph()
    info = AliasInfo(g)
    assert info.written_by == {store: frozenset({buf, view})}
    assert info.last_read(info.roots(buf)) == info.pos[store]
    assert info.last_read(frozenset({read})) == float("inf")  # the output reads it
    assert info.last_read(frozenset({info.output})) == -1.0  # nobody reads it


def test_last_read_counts_a_node_added_after_the_snapshot_as_last():
    g, buf, _, store, _ = _graph()
    info = AliasInfo(g)
    with g.inserting_before(store):
        g.call_function(aten.sin.default, (buf,))  # not in the snapshot
    assert info.last_read(info.roots(buf)) == float("inf")
