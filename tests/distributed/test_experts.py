"""Mixtures of experts found from the graph: stacks read by grouped matmuls and by id,
separate expert MLPs, and what keeps a router's experts whole."""

from __future__ import annotations

import pytest
import torch

from fxpass.distributed.experts import find_blocks
from fxpass.distributed.sites import Params

from _models import exported

_hf = pytest.importorskip("_hf")


def _blocks(ep):
    return find_blocks(ep.graph_module, Params(ep.graph_module, ep.graph_signature))


def test_grouped_and_gathered_stacks():
    blocks, refused = _blocks(_hf.exported("gpt_oss"))
    assert refused == [] and len(blocks) == 2
    b = blocks[0]
    assert b.experts == 4 and len(b.tensors) == 4  # gate_up, its bias, down, its bias
    assert len(b.grouped) == 2 and len(b.gathers) == 2 and len(b.exits) == 1
    value, ids = b.exits[0]
    assert value.meta["val"].shape == (16, 64) and ids.meta["val"].shape == (16,)  # 8 tokens x 2


def test_separate_expert_mlps():
    blocks, _ = _blocks(exported(dtype=torch.float32, layers=1, moe_experts=4))
    (b,) = blocks
    assert len(b.mlps) == 4 and len(b.tensors) == 12  # gate, up, down of each expert
    assert "separate linears" in b.describe(Params(b.router.graph.owning_module)).reason


def test_dense_models_and_batched_experts_have_no_block():
    assert _blocks(_hf.exported("llama")) == ([], [])
    assert _blocks(_hf.exported("llama4"))[0] == []  # cut by expert as a batch instead


class _Leaky(torch.nn.Module):
    """Experts gathered by id, and the same stack read whole (a norm of all experts)."""

    def __init__(self) -> None:
        super().__init__()
        self.router = torch.nn.Linear(8, 4, bias=False)
        self.w = torch.nn.Parameter(torch.randn(4, 8, 8))

    def forward(self, x):
        _, ids = torch.topk(self.router(x), 2)
        rows = torch.bmm(x.repeat_interleave(2, 0)[:, None], self.w[ids.reshape(-1)])
        return rows.sum() + self.w.sum()


def test_an_expert_stack_read_whole_keeps_its_block_whole():
    blocks, refused = _blocks(torch.export.export(_Leaky(), (torch.randn(3, 8),)))
    assert blocks == [] and len(refused) == 1
    assert refused[0].startswith("'topk': ") and "reads the expert tensor 'w' whole" in refused[0]
