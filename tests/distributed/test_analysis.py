"""The analysis finds column, row and vocab-parallel weights from graph structure alone, says
why, and refuses what cannot be split with a one-line error naming the layer and numbers."""

from __future__ import annotations

import pytest
import torch

import fxpass as fp
from fxpass.distributed import Mesh, ShardError, analyze, choose_mesh

from _models import exported

_hf = pytest.importorskip("_hf")

aten = torch.ops.aten


def _styles(plan) -> dict[str, int]:
    out: dict[str, int] = {}
    for d in plan:
        out[d.style] = out.get(d.style, 0) + 1
    return out


@pytest.mark.parametrize("family", _hf.SHARDED)
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


@pytest.mark.parametrize("family", _hf.SHARDED)
def test_only_routers_stay_whole_and_say_why(family):
    # a router's top-k or softmax reads all of its output; a gate with one output cannot be
    # cut; everything else — q/k norms over the whole projection, interleaved rotary,
    # sinks, experts — is cut
    plan = analyze(_hf.exported(family), 2)
    for d in plan:
        if d.style == "replicate":
            assert d.param.split(".")[-2] in ("gate", "router", "wg", "shared_expert_gate")
            assert d.reason.startswith("replicated: ") and "costs each rank" in d.reason
            assert d.bytes > 0


def test_olmo3_norms_over_the_whole_projection_are_distributed():
    plan = analyze(_hf.exported("olmo3"), 2)
    norms = [d for d in plan if "_norm" in d.param and "self_attn" in d.param]
    assert len(norms) == 4 and {d.style for d in norms} == {"slice"}  # q and k, 2 layers
    assert plan["model.layers.0.self_attn.q_proj.weight"].style == "column"
    sums = [c for c in plan.collectives if c["shape"][-1] == 1]  # the sums of squares
    assert len(sums) == 4 and all(c["bytes"] == 8 * 4 for c in sums)  # 8 tokens, fp32


def test_glm4_interleaved_rotary_and_gpt_oss_sinks_follow_the_heads():
    glm4 = analyze(_hf.exported("glm4"), 2)
    assert glm4["model.layers.0.self_attn.q_proj.weight"].style == "column"
    gpt_oss = analyze(_hf.exported("gpt_oss"), 2)
    sinks = gpt_oss["model.layers.0.self_attn.sinks"]
    assert sinks.style == "slice" and sinks.dim == 0 and "cat" in sinks.node


def test_experts_are_split_and_the_combine_cost_stated():
    plan = analyze(_hf.exported("mixtral"), 2)
    assert plan.mesh == Mesh(ep=2) and len(plan.experts) == 2
    block = plan.experts[0]
    assert block.experts == 4 and len(block.weights) == 2
    assert "combined by all-reduce: 2,048 bytes per rank, against 5,120" in block.reason


def test_experts_cut_along_their_features_over_tp():
    plan = analyze(_hf.exported("gpt_oss"), mesh=Mesh(tp=2))
    gate_up = plan["model.layers.0.mlp.experts.gate_up_proj"]
    assert (gate_up.style, gate_up.dim) == ("column", 2) and "one in 2" in gate_up.reason
    assert plan["model.layers.0.mlp.experts.down_proj"].style == "row"
    assert plan["model.layers.0.mlp.experts.gate_up_proj_bias"].style == "slice"


def test_a_mesh_must_fit_the_experts():
    with pytest.raises(ShardError, match="ep 2 splits experts, but the program has no") as e:
        analyze(_hf.exported("llama"), mesh=Mesh(ep=2))
    assert "\n" not in str(e.value)
    with pytest.raises(ShardError, match="the 4 experts of 'topk' across ep 8 groups") as e:
        analyze(_hf.exported("mixtral"), mesh=Mesh(ep=8))
    assert "use ep <= 4" in str(e.value)


def test_mesh_chosen_for_experts():
    ep = _hf.exported("qwen3_moe")
    assert choose_mesh(ep, 2) == Mesh(ep=2) and choose_mesh(ep, 4) == Mesh(ep=4)
    assert choose_mesh(ep, 8) == Mesh(tp=2, ep=4)  # 4 experts: the rest cut each expert
    assert choose_mesh(exported(dtype=torch.float32, layers=1), 4) == Mesh(tp=4)


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
