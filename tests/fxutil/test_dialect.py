from __future__ import annotations

import pytest
import torch

from fxpass.fxutil.dialect import aten_op, edge_op, is_edge_op

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
