"""Memory: the storage model the stream checker and the multi_stream pass share."""

from __future__ import annotations

import torch
from torch import fx

from fxpass.edit.memory import Memory

aten = torch.ops.aten


class _Gqa(torch.nn.Module):
    def forward(self, q, k):
        repeated = k[:, :, None].expand(1, 2, 2, 8, 16).reshape(1, 4, 8, 16)  # copies
        view = q.reshape(1, 4, 128)  # a view of q
        top = torch.topk(view.sum(-1), 2)
        return repeated.sin() + q, top.values, top.indices


def _graph() -> tuple[fx.Graph, dict[str, fx.Node]]:
    inputs = (torch.randn(1, 4, 8, 16), torch.randn(1, 2, 8, 16))
    gm = torch.export.export(_Gqa(), inputs).graph_module
    return gm.graph, {n.name: n for n in gm.graph.nodes}


def test_roots_follow_what_nodes_do():
    graph, n = _graph()
    mem = Memory(graph)
    assert mem.roots(n["expand"]) == {n["k"]}  # a view of the input
    assert mem.roots(n["reshape"]) == {n["reshape"]}  # the copy has memory of its own
    assert mem.kernel(n["reshape"]) and not mem.kernel(n["expand"])
    assert mem.roots(n["reshape_1"]) == {n["q"]}
    assert mem.written(n["reshape"]) == {n["reshape"]}
    assert mem.read(n["sin"]) == {n["reshape"]: n["reshape"]}
    topk = n["topk"]
    values, indices = (u for u in n.values() if u.op == "call_function" and u.args[0] is topk)
    assert {values, indices} <= mem.written(topk)  # the tuple's elements, written by topk
    assert Memory.writer(values) is topk and Memory.external(n["q"])


def test_free_points_are_the_last_use_of_any_holder():
    graph, _n = _graph()
    free = Memory(graph).free_points()
    freed = {root.name: at.name for at, roots in free.items() for root in roots}
    assert freed["reshape"] == "sin"  # the copy dies after its one reader
    assert "q" not in freed and "k" not in freed  # the caller's memory is never freed
    assert "add" not in freed  # returned


def test_nodes_added_later_are_analysed_when_asked():
    graph, n = _graph()
    mem = Memory(graph)
    with graph.inserting_after(n["sin"]):
        keep = graph.call_function(torch.ops.fxpass.record_stream.default, (n["sin"], 1))
        view = graph.call_function(aten.view.default, (n["sin"], [-1]))
        dense = graph.call_function(aten.reshape.default, (n["sin"], [-1]))
        maybe = graph.call_function(aten.reshape.default, (view, [-1]))
    assert mem.roots(keep) == frozenset() and not mem.kernel(keep)
    assert mem.roots(view) == {n["sin"]} and not mem.kernel(view)  # a view, whatever
    assert mem.roots(dense) == {n["sin"]} and not mem.kernel(dense)  # sin's layout says so
    assert mem.roots(maybe) == {n["sin"], maybe} and mem.kernel(maybe)  # no value: either
