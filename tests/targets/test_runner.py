"""The one runner behind the targets: resolve once, attach instruments, keep reports."""

import torch

import fxpass as fp
from fxpass.targets.runner import Runner, graph_sample_inputs


class _Seen(fp.core.Instrumentation):
    def __init__(self) -> None:
        self.passes: list[str] = []

    def before_pass(self, record, gm, ctx) -> None:
        self.passes.append(record.name)


def test_runner_resolves_once_attaches_instruments_and_keeps_reports(llama_gm):
    seen = _Seen()
    runner = Runner("remove_assert_ops,cse", instrument=[seen])
    assert runner.pipeline is runner.pipeline  # parsed once
    first = runner.run(llama_gm, graph_sample_inputs(llama_gm))
    second = runner.run(llama_gm)
    assert first.modified and not second.modified
    assert runner.reports == [first.report, second.report]
    assert seen.passes == ["remove_assert_ops", "cse"] * 2
    assert Runner().pipeline is not Runner().pipeline  # None: the default list, read anew
    shared = Runner("dce", reports=runner.reports)
    shared.run(llama_gm)
    assert len(runner.reports) == 3


def test_graph_sample_inputs_come_from_the_placeholders(llama_gm):
    vals = graph_sample_inputs(llama_gm)
    placeholders = [n for n in llama_gm.graph.nodes if n.op == "placeholder"]
    assert len(vals) == len(placeholders) and all(isinstance(v, torch.Tensor) for v in vals)
    traced = torch.fx.symbolic_trace(torch.nn.Linear(4, 4))  # no meta["val"]: none to derive
    assert graph_sample_inputs(traced) is None
