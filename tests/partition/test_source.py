"""Source partitions: nodes grouped by the module or function they came from."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from _partition_helpers import exported_with_args
from torch import nn

from fxpass.partition import (
    SourcePartition,
    check_subgraphs_connected,
    fuse_partitions,
    source_partitions,
)

import _models

aten = torch.ops.aten


@pytest.fixture(scope="module")
def llama() -> torch.export.ExportedProgram:
    return _models.exported(layers=2)


def test_linear_modules_of_an_export_graph(llama):
    parts = source_partitions(llama, [nn.Linear])[nn.Linear]
    assert len(parts) == 2 * 7 + 1  # q, k, v, o, gate, up, down per layer + lm_head
    assert parts[0].name == "layers.0.self_attn.q_proj"
    assert parts[-1].name == "lm_head"
    for part in parts:
        assert isinstance(part, SourcePartition) and part.source is nn.Linear
        assert aten.mm.default in {n.target for n in part.nodes}
        # the weight is a parameter, not an input; on an ExportedProgram it is a placeholder
        assert len(part.params) == 1 and part.params[0].op == "placeholder"
        assert part.params[0].name.endswith("_weight")
        assert part.params[0] not in part.input_nodes
        assert len(part.input_nodes) == 1
        assert part.output_nodes == [part.nodes[-1]]


def test_functions_match_through_torch_fn(llama):
    by_function = source_partitions(llama, [F.linear])[F.linear]
    by_name = source_partitions(llama, ["linear"])["linear"]
    assert len(by_function) == len(by_name) == 15
    assert [p.nodes for p in by_function] == [p.nodes for p in by_name]
    assert by_function[0].name == "linear_1"


def test_graph_lists_are_in_graph_order(llama):
    graph = llama.graph_module.graph
    position = {n: i for i, n in enumerate(graph.nodes)}
    for part in source_partitions(graph, [nn.Linear, nn.Embedding])[nn.Linear]:
        for nodes in (part.nodes, part.input_nodes, part.output_nodes):
            assert [position[n] for n in nodes] == sorted(position[n] for n in nodes)


def test_get_attr_parameters_on_traced_graphs():
    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 5))
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(model, pre_dispatch=False)(torch.randn(2, 3))
    # make_fx leaves no source metadata: nothing to group
    assert source_partitions(gm, [nn.Linear]) == {}
    ep = torch.export.export(model, (torch.randn(2, 3),))
    parts = source_partitions(ep, [nn.Linear, nn.ReLU])
    assert [p.name for p in parts[nn.Linear]] == ["0", "2"]
    assert [len(p.params) for p in parts[nn.Linear]] == [2, 2]  # weight and bias
    (relu,) = parts[nn.ReLU]
    assert relu.input_nodes == parts[nn.Linear][0].output_nodes
    assert check_subgraphs_connected(parts[nn.Linear][0], relu)
    assert not check_subgraphs_connected(relu, parts[nn.Linear][0])


def test_filter_fn_and_missing_sources(llama):
    def no_lm_head(node):
        return "lm_head" not in str(node.meta.get("nn_module_stack"))

    parts = source_partitions(llama, nn.Linear, filter_fn=no_lm_head)[nn.Linear]
    assert len(parts) == 14
    assert source_partitions(llama, [nn.Conv2d]) == {}
    with pytest.raises(TypeError, match="expected a GraphModule, Graph or ExportedProgram"):
        source_partitions([1, 2], [nn.Linear])


def test_source_partitions_fuse():
    ep, args, expected = exported_with_args()
    parts = source_partitions(ep, [nn.Linear])[nn.Linear]
    fuse_partitions(ep.graph_module, parts, mode="delegate", prefix="linear_")
    assert not any(n.target is aten.mm.default for n in ep.graph_module.graph.nodes)
    for actual, wanted in zip(ep.graph_module(*args), expected):
        assert torch.equal(actual, wanted)
