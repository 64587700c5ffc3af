"""Pattern partitions: matches (found by the rewrite engine) and supported ops, merged."""

from __future__ import annotations

import functools

import pytest
import torch
from _partition_helpers import exported_with_args, name_sets
from torch import fx
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import any_chain as torch_any_chain
from torch.fx.passes.operator_support import create_op_support
from torch.fx.passes.utils.matcher_utils import SubgraphMatcher

from fxpass.partition import find_cycle, fuse_partitions, parse_support
from fxpass.partition.from_patterns import (
    generate_pattern_op_partitions,
    graph_pattern,
    pattern_matches,
    pattern_partitions,
)
from fxpass.rewrite import P, Rule

import _models

aten = torch.ops.aten


class _Norm(torch.nn.Module):
    def __init__(self, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps

    def forward(self, x):
        h = x.float()
        return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)


@functools.cache
def _norm_graph(eps: float = 1e-6) -> fx.GraphModule:
    x = torch.randn(1, 8, 64, dtype=torch.bfloat16)
    gm = torch.export.export(_Norm(eps), (x,)).run_decompositions().graph_module
    for node in list(gm.graph.nodes):
        if node.target is aten._assert_tensor_metadata.default:
            gm.graph.erase_node(node)
    gm.recompile()
    return gm


@pytest.fixture
def gm() -> fx.GraphModule:
    return _models.exported_gm(remove_asserts=True)


def test_pattern_graphs_find_every_norm(gm):
    matches = pattern_matches(gm, [_norm_graph()])
    assert len(matches) == 2 * 2 + 1  # two norms per layer and the final one
    for nodes in matches:
        assert {n.target for n in nodes} == {
            aten._to_copy.default,
            aten.pow.Tensor_Scalar,
            aten.mean.dim,
            aten.add.Tensor,
            aten.rsqrt.default,
            aten.mul.Tensor,
        }


def _norm_fn(x, eps):
    h = x.float()
    return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)


def test_functions_are_traced_by_the_rewrite_engine():
    # export's asserts stay in the graph: they hang off the norm and must not block matching
    graph = _models.exported_gm()
    example = (torch.randn(1, 8, 64, dtype=torch.bfloat16), 1e-5)
    matches = pattern_matches(graph, [(_norm_fn, example)])
    assert len(matches) == 5  # eps is a scalar parameter: it matches the graph's 1e-6
    assert matches == pattern_matches(graph, [(_norm_fn, example, "aten")])
    by_graph = pattern_matches(_models.exported_gm(remove_asserts=True), [_norm_graph()])
    assert [[n.name for n in m] for m in matches] == [[n.name for n in m] for m in by_graph]


def test_literals_must_agree_unless_ignored(gm):
    assert pattern_matches(gm, [_norm_graph(1e-5)]) == []
    assert len(pattern_matches(gm, [_norm_graph(1e-5)], ignore_literals=True)) == 5


def test_rewrite_patterns_and_rules_are_accepted(gm):
    x = P.var("x")
    rsqrt_of_add = P(aten.rsqrt.default, P(aten.add.Tensor, x, P.const("eps")))
    assert len(pattern_matches(gm, [rsqrt_of_add])) == 5
    rule = Rule(rsqrt_of_add, lambda x, eps: None, contained=False)
    assert pattern_matches(gm, [rule]) == pattern_matches(gm, [rsqrt_of_add])
    with pytest.raises(TypeError, match="pattern 0: expected"):
        pattern_matches(gm, ["rsqrt"])


def test_graph_pattern_shares_nodes_used_twice():
    pattern = graph_pattern(_norm_graph())
    casts = [p for p in pattern.walk() if isinstance(p, P) and aten._to_copy.default in p.ops()]
    assert len(casts) == 1  # one pattern object for the cast both the pow and the mul read


def test_partitions_are_matches_plus_supported_ops(gm):
    parts = pattern_partitions(gm, [_norm_graph()], "ops(aten.add.Tensor)")
    assert find_cycle(parts) is None
    matched = {n for m in pattern_matches(gm, [_norm_graph()]) for n in m}
    support = parse_support("ops(aten.add.Tensor)")
    placed = {n for p in parts for n in p.nodes}
    assert placed == matched | {n for n in gm.graph.nodes if support(n)}
    # the rope's muls are not in any match and not supported: they stay out
    assert not any(n.target is aten.neg.default for n in placed)


def test_same_partitions_as_executorch_on_torch_tools(gm):
    """ExecuTorch's recipe: SubgraphMatcher matches + any_chain + CapabilityBasedPartitioner."""
    pattern = _norm_graph()
    matched = set()
    for match in SubgraphMatcher(pattern.graph).match(gm.graph):
        matched.update(
            n for p, n in match.nodes_map.items() if p.op != "placeholder" and n.op != "placeholder"
        )
    add = create_op_support(lambda m, n: n.op == "call_function" and n.target is aten.add.Tensor)
    tagged = create_op_support(lambda m, n: n in matched)
    theirs = CapabilityBasedPartitioner(
        gm, torch_any_chain(add, tagged), allows_single_node_partition=True
    ).propose_partitions()
    ours = generate_pattern_op_partitions(
        gm, [pattern], op_support=parse_support("ops(aten.add.Tensor)")
    )
    assert name_sets(ours) == name_sets(theirs)


def test_node_lists_and_support_alone(gm):
    norm_nodes = pattern_matches(gm, [_norm_graph()])
    by_lists = generate_pattern_op_partitions(gm, partitions_list=norm_nodes)
    by_pattern = generate_pattern_op_partitions(gm, [_norm_graph()])
    assert name_sets(by_lists) == name_sets(by_pattern)
    assert len(by_pattern) == 5
    only_support = pattern_partitions(gm, op_support="norm")
    assert only_support and all(p.size() >= 1 for p in only_support)
    with pytest.raises(ValueError, match="give patterns, a partitions_list or an op_support"):
        generate_pattern_op_partitions(gm)


def test_fusing_pattern_partitions_keeps_outputs():
    ep, args, expected = exported_with_args()
    gm = ep.graph_module
    parts = pattern_partitions(ep, [_norm_graph()], "ops(aten.add.Tensor)")
    fuse_partitions(gm, parts)
    assert not any(n.target is aten.rsqrt.default for n in gm.graph.nodes)
    for actual, wanted in zip(gm(*args), expected):
        assert torch.equal(actual, wanted)


def test_pattern_graph_returning_only_inputs_is_refused():
    graph = fx.Graph()
    x = graph.placeholder("x")
    graph.output(x)
    with pytest.raises(ValueError, match="computes nothing"):
        graph_pattern(graph)


def test_every_partitioner_names_itself_when_given_no_graph():
    from fxpass.partition import capability_partitions, pattern_partitions, source_partitions

    tail = r"expected a GraphModule, Graph or ExportedProgram, got int$"
    with pytest.raises(TypeError, match=r"^capability_partitions: " + tail):
        capability_partitions(3, "all")
    with pytest.raises(TypeError, match=r"^source_partitions: " + tail):
        source_partitions(3, [torch.nn.Linear])
    with pytest.raises(TypeError, match=r"^" + tail):
        pattern_partitions(3, partitions=[[]])
