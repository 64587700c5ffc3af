"""The one runner behind the targets: run what the target resolved, attach instruments,
keep reports."""

import pytest
import torch

import fxpass as fp
from fxpass.core.pipeline import resolve_pipeline
from fxpass.targets.runner import Runner, graph_sample_inputs


class _Seen(fp.core.Instrumentation):
    def __init__(self) -> None:
        self.passes: list[str] = []

    def before_pass(self, record, gm, ctx) -> None:
        self.passes.append(record.name)


def test_runner_resolves_once_attaches_instruments_and_keeps_reports(llama_gm):
    seen = _Seen()
    pipeline = resolve_pipeline("remove_assert_ops,cse")
    runner = Runner(pipeline, instrument=[seen])
    assert runner.pipeline is pipeline  # run as the target resolved it
    first = runner.run(llama_gm, graph_sample_inputs(llama_gm))
    second = runner.run(llama_gm)
    assert first.modified and not second.modified
    assert runner.reports == [first.report, second.report]
    assert seen.passes == ["remove_assert_ops", "cse"] * 2
    assert Runner().pipeline is not Runner().pipeline  # None: the default list, read anew
    with pytest.raises(TypeError, match="resolved Pipeline"):
        Runner("dce")  # a spec is resolved where the target receives it
    shared = Runner(resolve_pipeline("dce"), reports=runner.reports)
    shared.run(llama_gm)
    assert len(runner.reports) == 3


def test_graph_sample_inputs_come_from_the_placeholders(llama_gm):
    vals = graph_sample_inputs(llama_gm)
    placeholders = [n for n in llama_gm.graph.nodes if n.op == "placeholder"]
    assert len(vals) == len(placeholders) and all(isinstance(v, torch.Tensor) for v in vals)
    traced = torch.fx.symbolic_trace(torch.nn.Linear(4, 4))  # no meta["val"]: none to derive
    assert graph_sample_inputs(traced) is None
