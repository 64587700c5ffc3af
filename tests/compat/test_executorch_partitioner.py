"""fxpass's partitioners as ExecuTorch Partitioners: the chosen nodes go to XNNPACK, the .pte
runs in the ExecuTorch runtime with eager's outputs, and ExportPasses see the delegates."""

from __future__ import annotations

import copy
import functools
import re
from pathlib import Path

import pytest
import torch
from torch import nn

pytest.importorskip("executorch.exir")

import executorch.exir.pass_base as et
from _executorch_helpers import graph_difference
from executorch.exir import to_edge, to_edge_transform_and_lower
from executorch.exir.delegate import executorch_call_delegate
from executorch.exir.dialects._ops import ops as exir_ops
from executorch.runtime import Runtime

from fxpass.compat import executorch as compat
from fxpass.rewrite import P

edge = exir_ops.edge.aten
SUPPORT = "ops(aten.linear, aten.relu, aten.add.Tensor) & dtype(f32)"


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 8)

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        return self.fc2(h + h.sigmoid())  # sigmoid is left to the portable kernels


@functools.cache
def _model():
    torch.manual_seed(0)
    model = Mlp().eval()
    return model, (torch.randn(4, 16),)


@functools.cache
def _lowered():
    model, inputs = _model()
    ep = torch.export.export(model, inputs)
    partitioner = compat.CapabilityPartitioner(SUPPORT, "XnnpackBackend")
    return to_edge_transform_and_lower(ep, partitioner=[partitioner])


def _edge_program():
    model, inputs = _model()
    return to_edge(torch.export.export(model, inputs)).exported_program()


def _targets(program):
    return [n.target for n in program.exported_program().graph.nodes if n.op == "call_function"]


def _run_pte(program, inputs):
    # The runtime's Method reads memory its Program owns: a Program dropped before the Method
    # runs is freed under it (outputs None or a crash, depending on what reuses the memory).
    loaded = Runtime.get().load_program(program.to_executorch().buffer)
    return loaded.load_method("forward").execute(list(inputs))[0]


def test_capability_partitions_lower_to_xnnpack_and_run():
    model, inputs = _model()
    lowered = copy.deepcopy(_lowered())
    targets = _targets(lowered)
    assert executorch_call_delegate in targets
    # linear stayed whole for the backend (ops_to_not_decompose); nothing it takes is left
    assert not {edge.linear.default, edge.relu.default, edge.add.Tensor} & set(targets)
    assert edge.sigmoid.default in targets
    torch.testing.assert_close(_run_pte(lowered, inputs), model(*inputs), rtol=1e-5, atol=1e-5)


def test_source_partitions_delegate_each_linear():
    ep = _edge_program()
    result = compat.SourcePartitioner([nn.Linear], "XnnpackBackend")(ep)
    assert sorted(result.partition_tags) == ["tag0", "tag1"]
    by_tag: dict[str, set] = {}
    for node in ep.graph.nodes:
        if node.op == "call_function" and "delegation_tag" in node.meta:
            by_tag.setdefault(node.meta["delegation_tag"], set()).add(node.target)
    assert all(edge.addmm.default in targets for targets in by_tag.values())
    assert not any(edge.relu.default in targets for targets in by_tag.values())


def test_partition_result_tags_nodes_and_constants():
    ep = _edge_program()
    patterns = [P(edge.relu.default, P.var("x"))]
    result = compat.PatternPartitioner(patterns, "XnnpackBackend", op_support="ops(aten.addmm)")(ep)
    assert isinstance(result, compat.PartitionResult)
    specs = list(result.partition_tags.values())
    assert specs and all(s == compat.DelegationSpec("XnnpackBackend", []) for s in specs)
    tagged = [n for n in ep.graph.nodes if "delegation_tag" in n.meta]
    assert {n.target for n in tagged if n.op == "call_function"} >= {
        edge.relu.default,
        edge.addmm.default,
    }
    assert any(n.op == "placeholder" for n in tagged)  # the weights go with their users


def test_unknown_backends_are_named():
    with pytest.raises(ValueError, match="no ExecuTorch backend 'NpuBackend' is loaded"):
        compat.CapabilityPartitioner(SUPPORT, "NpuBackend")


def test_export_passes_see_delegates_as_executorch_does():
    program = _lowered().exported_program()

    def rewrite(base):
        class SigmoidToRelu(base):
            def call_operator(self, op, args, kwargs, meta):
                if op == edge.sigmoid.default:
                    op = edge.relu.default
                return super().call_operator(op, args, kwargs, meta)

            def call_delegate(self, lowered_module, args, kwargs, meta):
                seen.append(type(lowered_module).__name__)
                return super().call_delegate(lowered_module, args, kwargs, meta)

        return SigmoidToRelu

    seen: list[str] = []
    ours = rewrite(compat.ExportPass)()(copy.deepcopy(program.graph_module)).graph_module
    theirs = rewrite(et.ExportPass)()(copy.deepcopy(program.graph_module)).graph_module
    assert graph_difference(theirs, ours) is None, graph_difference(theirs, ours)
    assert seen and set(seen) == {"LoweredBackendModule"}
    assert [name for name, _ in ours.named_children()] == [
        name for name, _ in theirs.named_children()
    ]


def test_no_runtime_method_outlives_its_program():
    """ExecuTorch's Python ``Method`` does not keep its ``Program`` alive: in
    ``load_program(pte).load_method(...)`` the Program is freed before the Method runs, and
    the run reads freed memory (this test module's own helper returned None in CI that way).
    Every caller in the repository keeps the Program in a name first."""
    root = Path(__file__).resolve().parents[2]
    chained = re.compile(r"load_program\([^\n]*\)\s*\.load_method\(")
    offenders = [
        f"{path.relative_to(root)}:{text[: m.start()].count(chr(10)) + 1}"
        for folder in ("src", "tests", "docs", "bench", "examples")
        for path in sorted((root / folder).rglob("*"))
        if path.suffix in {".py", ".md"}
        for text in [path.read_text()]
        for m in chained.finditer(text)
        if path != Path(__file__).resolve()
    ]
    assert not offenders, f"a Program dropped before its Method runs: {offenders}"
