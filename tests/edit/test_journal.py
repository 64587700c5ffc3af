"""The editor's journal undoes a failed run exactly, and the checks lint what changed."""

from __future__ import annotations

import copy

import pytest
import torch

import fxpass as fp
from fxpass.core.errors import CheckFailedError, PassFailedError

import _models


def _state(gm):
    return [
        (n, n.name, n.op, n.target, n.args, n.kwargs, list(n.users), dict(n.meta))
        for n in gm.graph.nodes
    ]


def _boom(gm):
    raise RuntimeError("boom")


@pytest.mark.parametrize("verify_each", ["changed", "full"])
def test_a_failed_run_after_a_journaled_pass_is_undone_node_for_node(verify_each):
    gm = _models.exported_gm()
    before = _state(gm)
    names = dict(gm.graph._graph_namespace._obj_to_name)
    pipe = fp.Pipeline(["fuse_add_rmsnorm", _boom], verify_each=verify_each)
    with pytest.raises(PassFailedError) as err:
        pipe.run(gm)
    assert _state(gm) == before
    assert dict(gm.graph._graph_namespace._obj_to_name) == names
    gm.graph.lint()
    adds = gm.graph.find_nodes(op="call_function", target=torch.ops.aten.add.Tensor)
    assert adds == [n for n in gm.graph.nodes if n.target is torch.ops.aten.add.Tensor]
    assert err.value.report.snapshots == ["_boom"]  # the function may edit anywhere


def test_a_journaled_pass_needs_no_snapshot_and_changes_are_seen():
    gm = _models.exported_gm()
    result = fp.Pipeline(["remove_assert_ops", "fuse_add_rmsnorm"]).run(gm)
    assert result.modified
    assert "fuse_add_rmsnorm" not in result.report.snapshots


def _break_order(gm):
    """Through the editor, moves a node before what it reads (lint must catch it)."""
    node = next(n for n in gm.graph.nodes if n.op == "call_function" and n.all_input_nodes)
    first = next(iter(gm.graph.nodes))
    fp.current_context().editor.move(node, before=first, rule="break")
    return True


_break_order.edits = "editor"


@pytest.mark.parametrize("verify_each", ["changed", "full"])
def test_the_checks_over_changed_nodes_catch_a_broken_order(verify_each):
    gm = _models.exported_gm()
    before = _state(gm)
    with pytest.raises(CheckFailedError, match="lint"):
        fp.Pipeline([_break_order], verify_each=verify_each).run(gm)
    assert _state(gm) == before


def test_verify_each_takes_two_words():
    with pytest.raises(ValueError, match="verify_each takes"):
        fp.Pipeline([], verify_each="some")


def test_journaled_and_snapshotted_passes_mixed_roll_back_exactly():
    gm0 = _models.exported_gm()
    gm = copy.deepcopy(gm0)

    def erase_asserts(g):  # edits outside the editor
        for n in list(g.graph.nodes):
            if n.op == "call_function" and "assert" in str(n.target):
                g.graph.erase_node(n)
        return True

    before = _state(gm)
    with pytest.raises(PassFailedError):
        fp.Pipeline(["fuse_add_rmsnorm", erase_asserts, "fuse_add_rmsnorm", _boom]).run(gm)
    assert _state(gm) == before
    gm.graph.lint()


def _sneaky(gm):
    """Declares editor-only edits, then writes a node's metadata behind the editor's back."""
    node = next(n for n in gm.graph.nodes if n.op == "call_function")
    node.meta["sneaky"] = True
    return False


_sneaky.edits = "editor"


def test_the_full_checks_catch_an_edit_the_journal_did_not_see():
    gm = _models.exported_gm()
    before = _state(gm)
    with pytest.raises(CheckFailedError, match="outside the editor"):
        fp.Pipeline([_sneaky], verify_each="full").run(gm)
    # a snapshot is not taken for it, so this is exactly what the check exists for
    assert "sneaky" in next(n for n in gm.graph.nodes if n.op == "call_function").meta
    assert len(_state(gm)) == len(before)
    fp.Pipeline([_sneaky], verify_each="changed").run(gm)  # not audited: cheap runs trust it
