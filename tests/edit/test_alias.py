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


# ----- what a node does, from values ------------------------------------------------------------
def _exported(fn, *inputs) -> dict[str, fx.Node]:
    class M(torch.nn.Module):
        def forward(self, *args):
            return fn(*args)

    gm = torch.export.export(M(), inputs).graph_module
    return {n.name: n for n in gm.graph.nodes}


def test_a_reshape_of_an_expand_is_a_copy_and_of_a_dense_tensor_a_view():
    from fxpass.edit.alias import is_kernel, node_memory

    def repeat_kv(k):
        dense = k.reshape(2, 16, 16)  # (2, 2, 8, 16) row-major: a view
        return dense, k[:, :, None].expand(2, 2, 2, 8, 16).reshape(2, 4, 8, 16)

    nodes = _exported(repeat_kv, torch.randn(2, 2, 8, 16))
    views = {n.name for n in nodes.values() if node_memory(n).kind == "view"}
    assert {"reshape", "unsqueeze", "expand"} <= views
    copy = nodes["reshape_1"]
    assert node_memory(copy) == node_memory(copy).__class__("copy", (), fresh=True)
    assert is_kernel(copy) and not is_kernel(nodes["reshape"]) and not is_kernel(nodes["expand"])
    assert node_memory(nodes["reshape"]).shares == (nodes["args_0"],)


def test_contiguous_and_to_copy_only_when_they_must():
    from fxpass.edit.alias import node_memory

    def f(x):
        return x.t().contiguous(), x.to(torch.float32), x.to(torch.float16)

    kinds = {n.name: node_memory(n).kind for n in _exported(f, torch.randn(4, 8)).values()}
    assert kinds["contiguous"] == "copy" and kinds["to_1"] == "copy"  # (to float16)
    assert kinds["t"] == kinds["to"] == "view"  # to its own dtype returns the input
    assert kinds["_assert_tensor_metadata_default"] == "none"


def test_without_values_a_maybe_view_is_a_kernel_that_may_alias():
    from fxpass.edit.alias import node_memory

    g = fx.Graph()
    x = g.placeholder("x")
    r = g.call_function(aten.reshape.default, (x, [4]))
    e = g.call_function(aten.expand.default, (x, [4, 4]))
    mem = node_memory(r)
    assert mem.kind == "unknown" and mem.kernel and mem.shares == (x,) and mem.fresh
    assert node_memory(e).kind == "view"  # expand is a view whatever the layout


def test_split_pieces_alias_their_input():
    from fxpass.edit.alias import aliased_args, node_memory

    nodes = _exported(lambda x: (*torch.split(x, 2), x * 2), torch.randn(4, 3))
    split = next(n for n in nodes.values() if n.target is aten.split.Tensor)
    assert aliased_args(split) == [nodes["args_0"]]
    assert node_memory(split).kind == "view"
