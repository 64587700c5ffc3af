import operator

import pytest
import torch

from fxpass.fxutil.ops import existing_ops, op_name, resolve_op

aten = torch.ops.aten


def test_resolve_op_reads_every_spelling_and_op_name_reads_back():
    assert resolve_op("aten.add.Tensor") is aten.add.Tensor
    assert resolve_op("aten.add") is aten.add
    assert resolve_op("exir_ops.edge.aten.add.Tensor") is aten.add.Tensor
    assert resolve_op("torch.ops.aten.mm.default") is aten.mm.default
    assert resolve_op("getitem") is operator.getitem
    assert resolve_op("torch.nn.functional.linear") is torch.nn.functional.linear
    assert resolve_op("fxpass.rms_norm") is torch.ops.fxpass.rms_norm
    for op in (aten.add.Tensor, aten.add, operator.getitem):
        assert resolve_op(op_name(op)) is op


def test_an_unknown_op_gets_a_suggestion():
    with pytest.raises(ValueError, match="did you mean aten.add"):
        resolve_op("aten.addd.Tensor")


def test_existing_ops_skips_what_this_torch_lacks():
    assert existing_ops(["aten.mm", "aten.no_such_op", "operator.getitem"]) == [
        aten.mm,
        operator.getitem,
    ]
