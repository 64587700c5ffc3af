"""Operator supports and partitioners on ExecuTorch Edge programs: ATen names match Edge ops."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("executorch.exir")

from _edge import edge_program
from executorch.exir.dialects._ops import ops as exir_ops

from fxpass.partition import (
    OperatorSupport,
    capability_partitions,
    named_support,
    op_support,
    parse_support,
)
from fxpass.partition.capability import op_matcher
from fxpass.partition.support import resolve_op

aten = torch.ops.aten
edge = exir_ops.edge.aten


@pytest.fixture(scope="module")
def llama() -> torch.export.ExportedProgram:
    return edge_program("llama")


def _targets(support, ep) -> set:
    return {n.target for n in ep.graph.nodes if n.op == "call_function" and support(n)}


def test_aten_ops_and_names_accept_edge_ops(llama):
    for support in (
        op_support(aten.add.Tensor),
        op_support("aten.add.Tensor"),
        op_support(aten.add),  # the packet
        op_support(edge.add.Tensor),  # an Edge op stands for its ATen op
        parse_support("ops(edge.aten.add.Tensor)"),
        OperatorSupport({"torch.ops.aten.add.Tensor": None}),  # torch's support dict
    ):
        assert _targets(support, llama) == {edge.add.Tensor}, support


def test_edge_op_names_resolve_to_aten():
    assert resolve_op("exir_ops.edge.aten.mul.Tensor") is aten.mul.Tensor
    assert resolve_op("executorch.exir.dialects.edge._ops.aten.mul.Tensor") is aten.mul.Tensor
    assert resolve_op("edge.aten.mul") is aten.mul


def test_named_supports_see_edge_ops(llama):
    pointwise = _targets(named_support("pointwise"), llama)
    assert {edge.add.Tensor, edge.mul.Tensor, edge.rsqrt.default} <= pointwise
    assert edge.mean.dim in _targets(named_support("norm"), llama)
    views = _targets(parse_support("ops(aten.view_copy, aten.permute_copy)"), llama)
    assert views == {edge.view_copy.default, edge.permute_copy.default}


def test_named_ops_lists_what_a_support_names():
    support = parse_support("ops(aten.linear, aten.add.Tensor) & !ops(aten.mul.Tensor)")
    ops = support.named_ops()
    assert {aten.linear.default, aten.add.Tensor} <= ops and aten.mul.Tensor not in ops


def test_capability_partitions_of_an_edge_program(llama):
    parts = capability_partitions(llama, "elementwise | norm")
    assert parts
    inside = {n.target for p in parts for n in p.nodes}
    assert edge.add.Tensor in inside and edge.rsqrt.default in inside
    assert all(n.op == "call_function" for p in parts for n in p.nodes)


def test_non_compute_ops_match_edge_ops(llama):
    matches = op_matcher(["aten.view_copy"])
    views = [n for n in llama.graph.nodes if matches(n)]
    assert views and all(n.target == edge.view_copy.default for n in views)
