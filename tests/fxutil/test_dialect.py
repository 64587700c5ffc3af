from __future__ import annotations

import pytest
import torch

from fxpass.fxutil.dialect import (
    aten_op,
    edge_call,
    edge_op,
    graph_is_edge,
    has_dim_order_spelling,
    is_edge_op,
    spellings,
    uses_dim_order,
)

aten = torch.ops.aten


def test_aten_ops_are_their_own_aten_op():
    assert aten_op(aten.add.Tensor) is aten.add.Tensor
    assert not is_edge_op(aten.add.Tensor)
    assert aten_op("relu") == "relu"


def test_edge_ops_round_trip():
    pytest.importorskip("executorch.exir")
    from executorch.exir.dialects._ops import ops as exir_ops

    e = edge_op(aten.add.Tensor)
    assert e is exir_ops.edge.aten.add.Tensor and is_edge_op(e)
    assert aten_op(e) is aten.add.Tensor
    assert edge_op(e) is e
    assert aten_op(exir_ops.edge.aten.add) is aten.add
    assert aten_op(edge_op(torch.ops.fxpass.rms_norm.default)) is torch.ops.fxpass.rms_norm.default


def test_edge_op_of_a_missing_op_names_it():
    pytest.importorskip("executorch.exir")
    with pytest.raises(AttributeError, match="no op for"):
        edge_op(type("Op", (), {"name": lambda self: "nonexistent_ns::nope"})())


def test_dim_order_ops_are_their_aten_ops():
    pytest.importorskip("executorch.exir")
    from executorch.exir.dialects._ops import ops as exir_ops

    cast = exir_ops.edge.dim_order_ops._to_dim_order_copy.default
    clone = exir_ops.edge.dim_order_ops._clone_dim_order.default
    assert aten_op(cast) is aten._to_copy.default and aten_op(clone) is aten.clone.default
    assert aten_op(torch.ops.dim_order_ops._to_dim_order_copy.default) is aten._to_copy.default
    assert edge_op(cast) is cast  # an Edge op is its own Edge spelling
    assert has_dim_order_spelling(aten._to_copy.default)
    assert has_dim_order_spelling(aten.empty.memory_format)
    assert not has_dim_order_spelling(aten.add.Tensor)


def test_spellings_invert_aten_op():
    pytest.importorskip("executorch.exir")
    from executorch.exir.dialects._ops import ops as exir_ops

    assert spellings(aten.add.Tensor) == (exir_ops.edge.aten.add.Tensor,)
    casts = spellings(aten._to_copy.default)
    assert exir_ops.edge.dim_order_ops._to_dim_order_copy.default in casts
    assert all(aten_op(s) is aten._to_copy.default for s in casts)


def test_edge_call_spells_clones_and_casts_as_the_graph_does():
    pytest.importorskip("executorch.exir")
    from executorch.exir.dialects._ops import ops as exir_ops

    target, _, kwargs = edge_call(aten.clone.default, ("x",), {})
    assert target is exir_ops.edge.dim_order_ops._clone_dim_order.default and not kwargs
    target, _, kwargs = edge_call(aten._to_copy.default, ("x",), {"dtype": torch.float16})
    assert target is exir_ops.edge.dim_order_ops._to_dim_order_copy.default
    assert kwargs == {"dtype": torch.float16}
    target, _, _ = edge_call(aten.clone.default, ("x",), {}, dim_order=False)
    assert target is exir_ops.edge.aten.clone.default
    channels_last = {"memory_format": torch.channels_last}
    assert (
        edge_call(aten.clone.default, ("x",), channels_last)[0] is exir_ops.edge.aten.clone.default
    )
    assert edge_call(aten.relu.default, ("x",), {})[0] is exir_ops.edge.aten.relu.default


def test_graph_dialect_from_its_nodes():
    pytest.importorskip("executorch.exir")
    from _edge import edge_program

    edge = edge_program("convnet").graph.nodes
    assert graph_is_edge(edge) and uses_dim_order(edge)
    aten_graph = torch.export.export(torch.nn.ReLU(), (torch.randn(2),)).graph.nodes
    assert not graph_is_edge(aten_graph)
