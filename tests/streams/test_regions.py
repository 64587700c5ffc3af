"""find_regions: independent branches of real models, labelled by what they are."""

from __future__ import annotations

import torch
from _streams import original

from fxpass.streams import find_regions
from fxpass.streams.regions import module_path, walk


def _export(fn, *inputs) -> torch.fx.GraphModule:
    class M(torch.nn.Module):
        def forward(self, *args):
            return fn(*args)

    return torch.export.export(M(), inputs).graph_module


def test_moe_block_splits_into_routed_and_shared_experts():
    gm, _ = original("moe")
    moe = [r for r in find_regions(gm) if r.kind == "moe"]
    assert len(moe) == 2  # one per layer
    routed, shared = moe[0].branches
    assert routed.label.startswith("routed experts") and shared.label.startswith("shared expert")
    assert {"shared_expert" in module_path(n) for n in shared.kernels()} == {True}
    targets = {n.target for n in routed.nodes}
    assert torch.ops.aten.topk.default in targets
    assert not set(shared.nodes) & set(routed.nodes)


def test_parallel_block_splits_attention_from_mlp():
    gm, _ = original("parallel")
    regions = find_regions(gm)
    assert [r.kind for r in regions] == ["parallel_block", "parallel_block"]
    attention, mlp = regions[0].branches
    assert attention.label == "layers.0.self_attn" and mlp.label == "layers.0.mlp"


def test_q_and_k_split_inside_the_qkv_region():
    gm, _ = original("decoder")
    qkv = next(r for r in find_regions(gm) if r.kind == "qkv")
    labels = [b.label for b in qkv.branches]
    assert labels == ["layers.0.self_attn.q_proj", "layers.0.self_attn.v_proj"]
    inner = next(r for r in qkv.inner if r.fork is qkv.fork)  # q and k meet at q @ k^T first
    assert [b.label for b in inner.branches] == [
        "layers.0.self_attn.q_proj",
        "layers.0.self_attn.k_proj",
    ]
    nodes = {n for r in walk([qkv]) for n in r.nodes()}
    assert all(set(r.nodes()) <= nodes for r in walk(qkv.inner))


def test_branches_are_independent_and_end_at_the_join():
    gm = _export(lambda x: x.sin().exp() + x.cos(), torch.randn(4))
    (region,) = find_regions(gm)
    assert region.fork.name == "args_0" and region.join.target is torch.ops.aten.add.Tensor
    assert [[n.name for n in b.nodes] for b in region.branches] == [["sin", "exp"], ["cos"]]


def test_a_chain_has_no_regions():
    gm = _export(lambda x: x.sin().exp().cos(), torch.randn(4))
    assert find_regions(gm) == []
