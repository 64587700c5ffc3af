"""Capability partitioning on exported decoders and random DAGs."""

from __future__ import annotations

import copy
import itertools

import pytest
import torch
from _partition_helpers import SUPPORT, is_supported_add, name_sets, random_dags
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import fx
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner as TorchPartitioner

from fxpass.partition import (
    Partition,
    capability_partitions,
    find_cycle,
    node_support,
    parse_support,
)

import _models

aten = torch.ops.aten


@pytest.fixture(scope="module")
def llama() -> torch.export.ExportedProgram:
    return _models.exported(layers=2)


def test_partitions_hold_only_supported_nodes_and_are_cycle_free(llama):
    gm = llama.graph_module
    support = parse_support(SUPPORT)
    parts = capability_partitions(gm, SUPPORT)
    assert len(parts) > 10
    for part in parts:
        assert isinstance(part, Partition)
        assert all(support(n) for n in part.nodes)
        assert part.size() >= 2
    assert find_cycle(parts) is None
    # no node in two partitions
    assert sum(len(p) for p in parts) == len({n for p in parts for n in p.nodes})


def test_every_supported_node_is_placed_when_single_nodes_are_allowed(llama):
    gm = llama.graph_module
    support = parse_support(SUPPORT)
    parts = capability_partitions(gm, SUPPORT, allows_single_node_partition=True)
    placed = {n for p in parts for n in p.nodes}
    assert placed == {n for n in gm.graph.nodes if support(n)}
    assert find_cycle(parts) is None
    assert any(len(p) == 1 for p in parts)


def test_norms_land_whole_in_one_partition(llama):
    # each RMSNorm (pow, mean, add, rsqrt, mul, casts, weight mul) is one supported stretch
    parts = capability_partitions(llama, SUPPORT)
    for rsqrt in (n for n in llama.graph_module.graph.nodes if n.target is aten.rsqrt.default):
        home = next(p for p in parts if rsqrt in p)
        norm_ops = {n.target for n in home.nodes}
        assert {aten.pow.Tensor_Scalar, aten.mean.dim, aten.add.Tensor} <= norm_ops


def test_same_node_sets_as_torch_on_exported_decoders():
    for layers in (1, 2):
        gm = _models.exported_gm(layers=layers)
        support = parse_support(SUPPORT)
        theirs = TorchPartitioner(gm, support).propose_partitions()
        ours = capability_partitions(gm, support)
        assert name_sets(ours) == name_sets(theirs)
        singles = TorchPartitioner(gm, support, allows_single_node_partition=True)
        ours = capability_partitions(gm, support, allows_single_node_partition=True)
        assert name_sets(ours) == name_sets(singles.propose_partitions())


def test_results_are_in_graph_order_and_deterministic(llama):
    gm = llama.graph_module
    first = capability_partitions(gm, SUPPORT)
    position = {n: i for i, n in enumerate(gm.graph.nodes)}
    starts = [position[next(iter(p.nodes))] for p in first]
    assert starts == sorted(starts)
    assert [p.id for p in first] == list(range(len(first)))
    for part in first:
        order = [position[n] for n in part.nodes]
        assert order == sorted(order)
    again = capability_partitions(copy.deepcopy(gm), SUPPORT)
    assert [p.names for p in again] == [p.names for p in first]


def _module(fn, *inputs) -> fx.GraphModule:
    class M(torch.nn.Module):
        def forward(self, *args):
            return fn(*args)

    return torch.export.export(M(), inputs).run_decompositions().graph_module


def test_single_compute_nodes_are_dropped_unless_allowed():
    gm = _module(lambda x, w: torch.relu(x @ w) @ w, torch.randn(4, 4), torch.randn(4, 4))
    assert capability_partitions(gm, "elementwise") == []
    alone = capability_partitions(gm, "elementwise", allows_single_node_partition=True)
    assert [p.names for p in alone] == [["relu"]]
    allowed = capability_partitions(
        gm, "elementwise", allowed_single_node_partition_ops=["aten.relu"]
    )
    assert [p.names for p in allowed] == [["relu"]]
    by_op = capability_partitions(
        gm, "elementwise", allowed_single_node_partition_ops=[aten.relu.default]
    )
    assert [p.names for p in by_op] == [["relu"]]


def test_non_compute_ops_never_form_a_partition_alone_and_are_trimmed_from_the_ends():
    def fn(x, w):
        y = (x @ w).view(16)
        return (torch.relu(y) + 1).view(4, 4) @ w

    gm = _module(fn, torch.randn(4, 4), torch.randn(4, 4))
    support = "elementwise | view"
    trimmed = capability_partitions(gm, support, allows_single_node_partition=True)
    assert [sorted(p.names) for p in trimmed] == [["add", "relu"]]
    kept = capability_partitions(gm, support, trim_non_compute=False)
    assert [sorted(p.names) for p in kept] == [["add", "relu", "view", "view_1"]]
    # clone counts as non-compute when asked: {clone, view} alone is not a partition
    gm = _module(
        lambda x, w: torch.clone(x @ w).view(16) @ torch.ones(16),
        torch.randn(4, 4),
        torch.randn(4, 4),
    )
    assert [
        p.names for p in capability_partitions(gm, "elementwise | view", trim_non_compute=False)
    ]
    assert capability_partitions(gm, "elementwise | view", non_compute_ops=["aten.clone"]) == []


def test_horizontal_fusion_joins_independent_branches():
    def fn(x, y, w):
        return torch.relu(x) @ w + torch.sigmoid(y) @ w

    gm = _module(fn, torch.randn(4, 4), torch.randn(4, 4), torch.randn(4, 4))
    together = capability_partitions(gm, "elementwise", allows_single_node_partition=True)
    apart = capability_partitions(
        gm, "elementwise", allows_single_node_partition=True, horizontal=False
    )
    assert sorted(map(sorted, (p.names for p in together))) == [["add"], ["relu", "sigmoid"]]
    assert sorted(map(sorted, (p.names for p in apart))) == [["add"], ["relu"], ["sigmoid"]]


def test_accepts_graphs_and_exported_programs(llama):
    by_program = capability_partitions(llama, SUPPORT)
    by_graph = capability_partitions(llama.graph_module.graph, SUPPORT)
    assert [p.names for p in by_program] == [p.names for p in by_graph]
    with pytest.raises(TypeError, match="expected a GraphModule, Graph or ExportedProgram"):
        capability_partitions(object(), SUPPORT)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_dags())
def test_random_dags_cycle_free_maximal_and_complete(gm):
    support = node_support(is_supported_add)
    parts = capability_partitions(gm, support, allows_single_node_partition=True)
    assert find_cycle(parts) is None
    placed = {n for p in parts for n in p.nodes}
    assert placed == {n for n in gm.graph.nodes if is_supported_add(n)}
    # maximal: merging any two partitions would create a cycle
    for a, b in itertools.combinations(range(len(parts)), 2):
        merged = [p.nodes for i, p in enumerate(parts) if i not in (a, b)]
        merged.append({**parts[a].nodes, **parts[b].nodes})
        assert find_cycle(merged) is not None


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_dags(), st.booleans())
def test_random_dags_same_partitions_as_torch(gm, horizontal):
    support = node_support(is_supported_add)
    ours = capability_partitions(
        gm, support, allows_single_node_partition=True, horizontal=horizontal
    )
    assert find_cycle(ours) is None
    theirs = TorchPartitioner(
        gm, support, allows_single_node_partition=True, skip_horizontal_fusion=not horizontal
    ).propose_partitions()
    if find_cycle(theirs) is None:  # torch's stale reachability sometimes proposes a cycle
        assert name_sets(ours) == name_sets(theirs)
