"""The compat pass managers are doors like ``fxpass.apply``: each runs through the one Runner
(targets/runner.py), so each gets the pipeline cache, ``TORCH_TRACE`` artifacts and a report
labelled with where it ran."""

from __future__ import annotations

import pytest
import torch

from fxpass.compat import fx as torch_compat
from fxpass.compat import sglang

from _models import ASSERT, exported, exported_gm
from _traces import fxpass_artifacts

CALLS: list[str] = []


def drop_asserts(gm):
    """Removes export's assertion nodes and counts its calls (a cache hit does not call it)."""
    CALLS.append("drop_asserts")
    for node in list(gm.graph.nodes):
        if node.target is ASSERT:
            gm.graph.erase_node(node)


class DropAsserts:
    """SGLang's kind of pass: a class whose instances are called on the module."""

    def __call__(self, gm):
        drop_asserts(gm)


@pytest.fixture
def trace_log():
    with fxpass_artifacts() as handler:
        yield handler


def _torch_manager(**kw):
    return torch_compat.PassManager([torch_compat.pass_result_wrapper(drop_asserts)], **kw)


def _sglang_run(gm, **kw):
    manager = sglang.PassManager(gm, **kw)
    manager.add(DropAsserts)
    result = manager.apply()
    return result.graph_module, result.report


def _torch_run(gm, **kw):
    manager = _torch_manager(**kw)
    result = manager(gm)
    assert manager.report is result.report
    return result.graph_module, result.report


def _executorch_run(gm, **kw):
    from fxpass.compat import executorch as et

    manager = et.PassManager([drop_asserts], **kw)
    result = manager(gm)
    return result.graph_module, manager.report


DOORS = {"torch.fx": _torch_run, "sglang": _sglang_run, "executorch": _executorch_run}


def _needs(door: str) -> None:
    if door == "executorch":
        pytest.importorskip("executorch.exir")


@pytest.mark.parametrize("door", DOORS)
def test_each_manager_labels_its_report_and_writes_its_trace(door, trace_log):
    _needs(door)
    gm, report = DOORS[door](exported_gm())
    assert not any(n.target is ASSERT for n in gm.graph.nodes)
    assert report.where["door"] == door
    label = report.where.get("pipeline", "")
    assert label, "the manager's pipeline is named in the report"
    names = trace_log.names
    assert names and names[0].endswith("_graph_before") and names[-1].endswith("_graph_after")
    assert any("drop_asserts" in n or "DropAsserts" in n for n in names), names


@pytest.mark.parametrize("door", DOORS)
def test_each_graph_module_manager_restores_a_cached_run(door, tmp_path):
    _needs(door)
    CALLS.clear()
    first, report = DOORS[door](exported_gm(), cache=tmp_path)
    assert CALLS == ["drop_asserts"] and not report.cached
    again, cached = DOORS[door](exported_gm(), cache=tmp_path)
    assert CALLS == ["drop_asserts"], "a cache hit does not run the passes"
    assert cached.cached and cached.where["door"] == door
    assert [str(n.target) for n in again.graph.nodes] == [str(n.target) for n in first.graph.nodes]


def test_the_program_manager_is_a_traced_labelled_door_without_a_cache(trace_log):
    pytest.importorskip("executorch.exir")
    from fxpass.compat import executorch as et

    manager = et.ExportedProgramPassManager([drop_asserts])
    result = manager(exported())
    assert not any(n.target is ASSERT for n in result.exported_program.graph.nodes)
    assert manager.report.where == {"door": "executorch", "pipeline": "ExportedProgramPassManager"}
    assert trace_log.names[0] == "fxpass_ExportedProgramPassManager_executorch_graph_before"
    with pytest.raises(TypeError, match="cache"):  # its passes change more than the graph
        et.ExportedProgramPassManager([drop_asserts], cache="somewhere")


def test_plain_modules_still_run_as_torch_runs_them():
    """No GraphModule, no pipeline: torch's loop, no report (nothing for a door to label)."""
    manager = torch_compat.PassManager([torch_compat.pass_result_wrapper(lambda module: None)])
    result = manager(torch.nn.Linear(2, 2))
    assert result.graph_module is not None and manager.report is None
