"""Rollback snapshots: whatever a pass does to the graph, restore() undoes it exactly."""

from __future__ import annotations

import functools

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import fx

from fxpass.core.snapshot import GraphSnapshot, fingerprint, same_fingerprint

import _models

aten = torch.ops.aten


@functools.cache
def _base():
    return _models.exported_gm(layers=1)


def _state(gm):
    nodes = list(gm.graph.nodes)
    return (
        nodes,
        [
            (n.name, n.op, n.target, n.args, n.kwargs, list(n.users), dict(n.meta), n._erased)
            for n in nodes
        ],
        str(gm.graph),
        gm.code,
        dict(gm._modules),
        dict(gm._buffers),
    )


def _compute(gm):
    return [n for n in gm.graph.nodes if n.op == "call_function" and "val" in n.meta]


def _insert(gm, i):
    nodes = _compute(gm)
    if nodes:
        n = nodes[i % len(nodes)]
        with gm.graph.inserting_after(n):
            new = gm.graph.call_function(aten.neg.default, (n,))
        n.replace_all_uses_with(new, delete_user_cb=lambda u: u is not new)


def _erase(gm, i):
    nodes = [n for n in _compute(gm) if len(n.users) == 1]
    if nodes:
        n = nodes[i % len(nodes)]
        src = next(iter(n.all_input_nodes), None)
        if src is not None:
            n.replace_all_uses_with(src)
            gm.graph.erase_node(n)


def _retarget(gm, i):
    nodes = [n for n in _compute(gm) if n.target is aten.mul.Tensor]
    if nodes:
        nodes[i % len(nodes)].target = aten.add.Tensor


def _rename(gm, i):
    nodes = _compute(gm)
    if nodes:
        nodes[i % len(nodes)]._rename(f"renamed_{i}")


def _move(gm, i):
    nodes = [n for n in _compute(gm) if not n.all_input_nodes]
    if nodes:
        gm.graph.output_node().prepend(nodes[i % len(nodes)])


def _meta(gm, i):
    nodes = _compute(gm)
    if nodes:
        n = nodes[i % len(nodes)]
        n.meta["val"] = None
        n.meta["new_key"] = i
        if i % 2:
            n.meta = {}


def _module(gm, i):
    gm.register_buffer(f"extra_{i}", torch.zeros(1))
    gm.add_submodule(f"sub_{i}", torch.nn.ReLU())


def _swap_graph(gm, i):
    gm.graph = fx.Graph()


def _recompile(gm, i):
    gm.recompile()


EDITS = [_insert, _erase, _retarget, _rename, _move, _meta, _module, _swap_graph, _recompile]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(EDITS), st.integers(0, 10_000)), max_size=12))
def test_restore_undoes_any_sequence_of_edits(edits):
    gm = _base()
    before = _state(gm)
    fp0 = fingerprint(gm)
    snap = GraphSnapshot.take(gm)
    for edit, i in edits:
        edit(gm, i)
    assert snap.restore() == []
    after = _state(gm)
    assert after[0] == before[0]
    assert after[1] == before[1]
    assert after[2:] == before[2:]
    gm.graph.lint()
    assert same_fingerprint(fp0, fingerprint(gm))
    gm.recompile()
    assert gm.code == before[3]


def test_fingerprint_sees_structural_changes_but_not_metadata():
    gm = _models.exported_gm(layers=1)
    f0 = fingerprint(gm)
    for n in gm.graph.nodes:
        n.meta["note"] = 1
    assert same_fingerprint(f0, fingerprint(gm))
    _retarget(gm, 0)
    assert not same_fingerprint(f0, fingerprint(gm))


def test_restore_reports_tensors_edited_in_place():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(2))

        def forward(self, x):
            return x * self.w

    gm = fx.symbolic_trace(M())
    snap = GraphSnapshot.take(gm)
    with torch.no_grad():
        gm.w.add_(1)
    assert snap.restore() == ["w"]
