"""A pass manager's check runs again only when something it reads changed."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("executorch.exir")

from _executorch_helpers import edge_program
from executorch.exir.error import ExportError

from fxpass.compat.executorch import ExportedProgramPassManager
from fxpass.compat.executorch._checked import checked, program_state


def _checked_now(ep) -> bool:
    return checked(ep, program_state(ep))


def test_a_checked_program_is_not_checked_again_until_it_changes():
    ep = edge_program("constant")
    manager = ExportedProgramPassManager([])
    assert not _checked_now(ep)
    manager.check(ep)
    assert _checked_now(ep)

    node = next(n for n in ep.graph.nodes if n.op == "call_function")
    node.meta["val"] = node.meta["val"].clone()  # metadata the verifier reads
    assert not _checked_now(ep)
    manager.check(ep)
    assert _checked_now(ep)

    key = next(iter(ep.constants))
    ep.constants[key] = ep.constants[key] * 2  # a new tensor object
    assert not _checked_now(ep)
    manager.check(ep)

    with ep.graph.inserting_after(node):
        extra = ep.graph.call_function(node.target, node.args, node.kwargs)
    extra.meta.update(node.meta)
    assert not _checked_now(ep)  # the graph changed
    ep.graph.erase_node(extra)
    assert _checked_now(ep)  # and is back to what passed


def test_a_failing_check_is_never_remembered():
    ep = edge_program("add_relu")
    gm = ep.graph_module
    x = next(n for n in gm.graph.nodes if n.op == "placeholder")
    with gm.graph.inserting_after(x):
        gm.graph.call_method("relu", (x,))
    manager = ExportedProgramPassManager([])
    for _ in range(2):  # the second time is checked again, and fails again
        with pytest.raises(ExportError, match="call_method"):
            manager.check(ep)
    assert not _checked_now(ep)


def test_the_state_holds_no_node_so_programs_are_freed():
    import gc
    import weakref

    ep = edge_program("add_relu")
    ExportedProgramPassManager([]).check(ep)
    gone = weakref.ref(ep.graph_module)
    del ep
    gc.collect()
    assert gone() is None


def test_manager_runs_check_the_result_once_per_state():
    ep = edge_program("add_relu")
    result = ExportedProgramPassManager([lambda gm: None])(ep)
    assert not result.modified and _checked_now(result.exported_program)
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    assert torch.equal(result.exported_program.module()(x, y), ep.module()(x, y))
