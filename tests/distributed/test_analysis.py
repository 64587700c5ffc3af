"""The analysis finds column, row and vocab-parallel weights from graph structure alone, says
why, and refuses what cannot be split with a one-line error naming the layer and numbers."""

from __future__ import annotations

import pytest
import torch

import fxpass as fp
from fxpass.distributed import ShardError, analyze

from _models import exported

_hf = pytest.importorskip("_hf")

aten = torch.ops.aten


def _styles(plan) -> dict[str, int]:
    out: dict[str, int] = {}
    for d in plan:
        out[d.style] = out.get(d.style, 0) + 1
    return out


@pytest.mark.parametrize("family", sorted(_hf.FAMILIES))
def test_every_family_splits_its_attention(family):
    ep = _hf.exported(family)
    plan = analyze(ep, 2)
    weights = {k: v for k, v in ep.state_dict.items()}
    rows = [d for d in plan if d.style == "row"]
    assert len(rows) >= 2  # at least each layer's attention output projection (2 layers)
    for d in plan:
        assert d.reason and d.node in {n.name for n in ep.graph.nodes}
        w = weights[d.param]
        if d.parts:  # a fused projection: its parts tile the output features
            assert sum(d.parts) == w.shape[0] and len(d.parts) > 1
    vocab = [d for d in plan if d.style == "vocab"]
    assert len(vocab) == 1 and plan.collectives[0]["op"] == "all_reduce"
    assert plan.collectives[-1]["op"] == "all_gather"  # the logits, cut along the vocab


@pytest.mark.parametrize("family", sorted(_hf.FAMILIES))
def test_what_stays_whole_says_which_op_stopped_it(family):
    # (a mixture of experts keeps its router: the softmax over the experts reads the
    # router's whole output; its experts are no linear sites, and attention is still cut)
    plan = analyze(_hf.exported(family), 2)
    for d in plan:
        if d.style == "replicate":
            assert d.reason.startswith("replicated: not column-parallel: '")
            assert "reduces over the sharded dim" in d.reason


@pytest.mark.parametrize("decompose", [False, True])
def test_fused_projections_are_cut_per_part(decompose):
    cfg = {"dtype": torch.float32, "fused_qkv": True, "fused_gate_up": True, "layers": 1}
    plan = analyze(exported(decompose=decompose, **cfg), 2)
    parts = {d.param.split(".")[-2]: d.parts for d in plan if d.style == "column"}
    assert parts == {"qkv_proj": [64, 64, 64], "gate_up_proj": [128, 128], "lm_head": []}


def test_heads_wider_than_hidden_over_heads():
    cfg = {"dtype": torch.float32, "head_size": 32, "kv_heads": 2, "layers": 1}
    plan = analyze(exported(**cfg), 2)
    q = plan["layers.0.self_attn.q_proj.weight"]
    assert (
        q.style == "column" and "2 slices of 32" in plan["layers.0.self_attn.k_proj.weight"].reason
    )
    assert q.reason.startswith("column-parallel: reads replicated")


def test_plan_prints_each_decision_and_the_collectives():
    text = str(analyze(exported(dtype=torch.float32, layers=1), 2))
    assert "row-parallel: reads" in text and "vocab-parallel" in text
    assert "collectives per step: 3 all_reduce, 1 all_gather" in text


@pytest.mark.parametrize("world_size", [0, -1, "2", 1.5, True])
def test_world_size_must_be_a_positive_integer(world_size):
    with pytest.raises(ShardError, match="world size must be a positive integer"):
        analyze(exported(dtype=torch.float32, layers=1), world_size)


def test_uneven_split_is_refused_naming_the_layer_and_numbers():
    with pytest.raises(ShardError) as e:
        analyze(exported(dtype=torch.float32, layers=1), 3)
    assert "across 3 ranks" in str(e.value) and "128 is not a multiple of 3" in str(e.value)
    assert "\n" not in str(e.value)


def test_uneven_layers_can_be_kept_whole():
    plan = analyze(exported(dtype=torch.float32, layers=1, intermediate=90), 4, uneven="replicate")
    mlp = [d for d in plan if "mlp" in d.param]
    assert {d.style for d in mlp} == {"replicate"} and "not a multiple of 4" in mlp[0].reason
    assert plan["layers.0.self_attn.q_proj.weight"].style == "column"


def test_fewer_kv_heads_than_ranks_is_refused():
    with pytest.raises(ShardError) as e:
        analyze(exported(dtype=torch.float32, layers=1, kv_heads=2), 4)
    msg = str(e.value)
    assert msg.startswith("cannot split layers.0.self_attn evenly across 4 ranks")
    assert "2 slices of 16" in msg and "2 is not a multiple of 4" in msg


def test_no_parallel_structure_is_an_error():
    class Classifier(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(8, 8)

        def forward(self, x):
            return torch.softmax(self.proj(x), dim=-1) * 2

    ep = torch.export.export(Classifier(), (torch.randn(2, 8),))
    plan = analyze(ep, 2)
    assert [d.style for d in plan] == ["replicate"] and "softmax" in plan["proj.weight"].reason
    with pytest.raises(ShardError, match="found no parallel structure"):
        fp.shard(ep, 2)
