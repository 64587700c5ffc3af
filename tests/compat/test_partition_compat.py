"""fxpass.compat.fx's partitioning names give torch's results (tests/compat mirror of
``fxpass/compat/_partition.py``; named so it does not clash with tests/passes/test_partition.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import fx, nn
from torch.fx.passes import operator_support as torch_support
from torch.fx.passes.infra import partitioner as torch_partitioner
from torch.fx.passes.shape_prop import ShapeProp
from torch.fx.passes.utils import fuser_utils as torch_fuser
from torch.fx.passes.utils import source_matcher_utils as torch_source

from fxpass.compat import fx as compat
from fxpass.partition import find_cycle, parse_support

import _models

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "partition"))
from _partition_helpers import (
    SUPPORT,
    exported_with_args,
    is_supported_add,
    random_dags,
)

aten = torch.ops.aten


def exact(parts) -> list:
    return [(p.id, [(n.name, order) for n, order in p.nodes.items()]) for p in parts]


OPTIONS = [
    {},
    {"allows_single_node_partition": True},
    {"skip_horizontal_fusion": True},
    {"non_compute_ops": ["torch.ops.aten._to_copy.default"]},
    {"allowed_single_node_partition_ops": ["torch.ops.aten.neg.default"]},
]


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: ",".join(o) or "defaults")
def test_propose_partitions_equals_torch(options):
    gm = _models.exported_gm(layers=2)
    support = parse_support(SUPPORT)
    theirs = torch_partitioner.CapabilityBasedPartitioner(gm, support, **options)
    ours = compat.CapabilityBasedPartitioner(gm, support, **options)
    assert exact(ours.propose_partitions()) == exact(theirs.propose_partitions())


def test_torch_support_objects_work_with_ours():
    gm = _models.exported_gm(layers=1)

    class AddMul(torch_support.OperatorSupportBase):
        def is_node_supported(self, submodules, node):
            return node.op == "call_function" and node.target in (aten.add.Tensor, aten.mul.Tensor)

    theirs = torch_partitioner.CapabilityBasedPartitioner(gm, AddMul()).propose_partitions()
    ours = compat.CapabilityBasedPartitioner(gm, AddMul()).propose_partitions()
    assert theirs and exact(ours) == exact(theirs)


def test_fused_modules_have_torch_code():
    support = parse_support(SUPPORT)
    gm_theirs, gm_ours = _models.exported_gm(), _models.exported_gm()
    theirs = torch_partitioner.CapabilityBasedPartitioner(gm_theirs, support)
    ours = compat.CapabilityBasedPartitioner(gm_ours, support)
    fused_theirs = theirs.fuse_partitions(theirs.propose_partitions())
    fused_ours = ours.fuse_partitions(ours.propose_partitions())
    fused_theirs.recompile()
    assert fused_ours.code == fused_theirs.code
    children = dict(fused_theirs.named_children())
    for name, sub in fused_ours.named_children():
        assert sub.code == children[name].code


def test_partition_and_fuse_runs():
    ep, args, expected = exported_with_args()
    partitioner = compat.CapabilityBasedPartitioner(ep.graph_module, parse_support(SUPPORT))
    fused = partitioner.partition_and_fuse()
    assert any(n.op == "call_module" for n in fused.graph.nodes)
    for actual, wanted in zip(fused(*args), expected):
        assert torch.equal(actual, wanted)


def test_remove_bookend_non_compute_ops_equals_torch():
    gm = _models.exported_gm(layers=1)
    support = parse_support("elementwise | norm | view")
    options = {"non_compute_ops": ["torch.ops.aten.view.default", "torch.ops.aten.permute.default"]}
    theirs = torch_partitioner.CapabilityBasedPartitioner(gm, support, **options)
    ours = compat.CapabilityBasedPartitioner(gm, support, **options)
    parts_theirs, parts_ours = theirs.propose_partitions(), ours.propose_partitions()
    theirs.remove_bookend_non_compute_ops(parts_theirs)
    ours.remove_bookend_non_compute_ops(parts_ours)
    assert exact(parts_ours) == exact(parts_theirs)
    assert sum(map(len, (p.nodes for p in parts_ours))) < sum(
        map(len, (p.nodes for p in ours.propose_partitions()))
    )


def test_fuse_by_partitions_equals_torch():
    gm_theirs, gm_ours = _models.exported_gm(), _models.exported_gm()
    support = parse_support(SUPPORT)
    pick = [
        p.nodes for p in compat.CapabilityBasedPartitioner(gm_ours, support).propose_partitions()
    ]
    by_name = {n.name: n for n in gm_theirs.graph.nodes}
    pick_theirs = [{by_name[n.name]: o for n, o in p.items()} for p in pick]
    torch_fuser.fuse_by_partitions(gm_theirs, pick_theirs, prefix="p_", always_return_tuple=True)
    compat.fuse_by_partitions(gm_ours, pick, prefix="p_", always_return_tuple=True)
    gm_theirs.recompile()
    assert gm_ours.code == gm_theirs.code


def _as_sets(result) -> dict:
    return {
        source: [
            (tuple(p.nodes), p.source, set(p.input_nodes), set(p.output_nodes), set(p.params))
            for p in parts
        ]
        for source, parts in result.items()
    }


@pytest.mark.parametrize("decompose", [True, False])
def test_get_source_partitions_equals_torch(decompose):
    graph = _models.exported(decompose=decompose).graph_module.graph
    wanted = [nn.Linear, nn.Embedding, "linear", "silu"]
    theirs = torch_source.get_source_partitions(graph, wanted)
    ours = compat.get_source_partitions(graph, wanted)
    assert ours and _as_sets(ours) == _as_sets(theirs)
    assert compat.check_subgraphs_connected(ours["linear"][0], ours["linear"][3]) is (
        torch_source.check_subgraphs_connected(theirs["linear"][0], theirs["linear"][3])
    )


def test_support_dict_equals_torch_on_shape_propagated_graphs():
    def fn(x, y):
        return torch.relu(x + y) * y.to(torch.float16).float()

    gm = fx.symbolic_trace(fn)
    ShapeProp(gm).propagate(torch.randn(2, 3), torch.randn(2, 3))
    table = {
        "_operator.add": None,
        "torch.relu": (([torch.float32],), {}),
        "_operator.mul": (([torch.float16], [torch.float32]), {}),
    }
    theirs = torch_support.OperatorSupport(table)
    ours = compat.OperatorSupport(table)
    for node in gm.graph.nodes:
        assert ours.is_node_supported({}, node) == theirs.is_node_supported({}, node), node.name


def test_chains_and_ready_made_supports():
    gm = _models.exported_gm(layers=1)
    add = compat.create_op_support(lambda m, n: n.target is aten.add.Tensor)
    bf16 = compat.OpSupports.decline_if_input_dtype(torch.float32)
    names = compat.OpSupports.decline_if_node_in_names({"add"})
    t_add = torch_support.create_op_support(lambda m, n: n.target is aten.add.Tensor)
    t_bf16 = torch_support.OpSupports.decline_if_input_dtype(torch.float32)
    t_names = torch_support.OpSupports.decline_if_node_in_names({"add"})
    ours = [compat.chain(add, names), compat.any_chain(add, names)]
    theirs = [torch_support.chain(t_add, t_names), torch_support.any_chain(t_add, t_names)]
    for node in gm.graph.nodes:
        for a, b in zip(ours, theirs):
            assert a.is_node_supported({}, node) == b.is_node_supported({}, node)
        if node.op == "call_function" and all(
            "tensor_meta" in a.meta for a in node.all_input_nodes
        ):
            assert bf16.is_node_supported({}, node) == t_bf16.is_node_supported({}, node)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_dags(), st.booleans(), st.booleans())
def test_random_dags_equal_torch_or_fix_its_cycles(gm, single, horizontal):
    support = compat.create_op_support(lambda m, n: is_supported_add(n))
    options = {"allows_single_node_partition": single, "skip_horizontal_fusion": not horizontal}
    ours = compat.CapabilityBasedPartitioner(gm, support, **options).propose_partitions()
    theirs = torch_partitioner.CapabilityBasedPartitioner(
        gm, support, **options
    ).propose_partitions()
    assert find_cycle(ours) is None
    if find_cycle(theirs) is None:
        assert exact(ours) == exact(theirs)


def test_torchs_operator_support_on_inputs_and_output_does_not_break_fusing():
    """torch's OperatorSupport says placeholders and the output are supported, so partitions
    hold them; torch then fuses a graph's inputs and return away. Ours fuses what computes."""
    from torch.fx.passes.operator_support import OperatorSupport

    from fxpass.compat.fx import CapabilityBasedPartitioner

    gm = torch.fx.symbolic_trace(lambda x, y: ((x * y).relu() + 1, x * y))
    support = OperatorSupport({"_operator.mul": None, "_operator.add": None})
    partitioner = CapabilityBasedPartitioner(gm, support, allows_single_node_partition=True)
    partitions = partitioner.propose_partitions()
    assert any(n.op == "output" for p in partitions for n in p.nodes)  # as torch proposes
    x, y = torch.randn(3), torch.randn(3)
    expected = gm(x, y)
    fused = partitioner.fuse_partitions(partitions)
    torch.testing.assert_close(fused(x, y), expected)
    assert [n.op for n in fused.graph.nodes if n.op == "placeholder"] == ["placeholder"] * 2
