"""The backend's pipeline cache: a second compile of the same model restores Dynamo's graph
as the passes left it, without running them, and says so; an edited pass runs again."""

from __future__ import annotations

import pytest
import torch
from _target_models import convnet

import fxpass as fp

RUNS: list[str] = []


def relu_to_clamp_counted(gm: torch.fx.GraphModule) -> bool:
    """relu -> clamp_min(x, 0) on Dynamo's graph, counting its runs."""
    RUNS.append("ran")
    changed = False
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target in (torch.relu, torch.nn.functional.relu):
            with gm.graph.inserting_before(node):
                new = gm.graph.call_function(torch.clamp_min, (node.args[0], 0.0))
            new.meta.update(node.meta)
            node.replace_all_uses_with(new)
            gm.graph.erase_node(node)
            changed = True
    return changed


@pytest.fixture(autouse=True)
def _fresh():
    RUNS.clear()
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _compile(cache, batch: int = 2) -> tuple[fp.targets.backend.FxpassBackend, list]:
    torch._dynamo.reset()
    model = convnet()
    seen = []

    def keep(gm, example_inputs):
        seen.append(gm)
        return gm.forward

    be = fp.backend([relu_to_clamp_counted, "cse"], ir="dynamo", compiler=keep, cache=cache)
    (x,) = model.example_inputs(batch=batch)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(model, backend=be)(x), model(x))
    return be, seen


def test_a_second_compile_restores_dynamos_graph_without_the_passes(tmp_path):
    first, (first_graph,) = _compile(tmp_path)
    assert RUNS == ["ran"] and first.reports[0].cached == ""
    again, (graph,) = _compile(tmp_path)
    assert RUNS == ["ran"], "restored, not run"
    (report,) = again.reports
    assert "fxpass cache" in report.cached and report.find("relu_to_clamp_counted").modified
    assert str(graph.graph) == str(first_graph.graph)
    assert all("example_value" in n.meta for n in graph.graph.nodes if n.op == "call_function")
    _compile(tmp_path, batch=6)  # another input shape: another graph, another key
    assert RUNS == ["ran", "ran"]
