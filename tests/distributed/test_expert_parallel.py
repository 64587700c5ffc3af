"""expert_parallel: each rank keeps its experts' rows of every stack (with a remainder),
its routing rotated so they come first, the other experts' rows zeroed where they leave;
plans whose experts are not the program's are refused."""

from __future__ import annotations

import pytest
import torch

import fxpass as fp
from fxpass.distributed import Mesh, PlanError, analyze, plan_shards
from fxpass.distributed.edits import KeepRows, MaskRows, Rotate
from fxpass.distributed.expert_parallel import expert_edits, expert_script
from fxpass.distributed.strategy import Survey

from _models import exported

_hf = pytest.importorskip("_hf")
aten = torch.ops.aten
STACK = "model.layers.0.mlp.experts.gate_up_proj"


@pytest.fixture(scope="module")
def mixtral():
    ep = _hf.exported("mixtral")
    return ep, fp.shard(ep, 2)


def _targets(program) -> list:
    return [n.target for n in program.graph.nodes if n.op == "call_function"]


def test_each_rank_keeps_its_experts(mixtral):
    ep, shards = mixtral
    whole = ep.state_dict[STACK]
    for rank in (0, 1):
        assert torch.equal(shards[rank].state_dict[STACK], whole[2 * rank : 2 * rank + 2])
    assert aten.remainder.Scalar not in _targets(shards[0])  # rank 0's experts come first
    assert _targets(shards[1]).count(aten.remainder.Scalar) == 2  # one per layer
    assert _targets(shards[0]).count(aten.where.ScalarOther) == 2  # the rows masked
    stats = shards.reports[1].stats()
    assert stats["expert_parallel.experts_kept"] == 4 and stats["expert_parallel.blocks"] == 2


def test_a_ranks_expert_edits_are_data(mixtral):
    ep, _ = mixtral
    planned = plan_shards(ep, 2)
    survey = Survey.of(ep, planned.mesh)
    script = expert_script(survey.gm, survey.params, planned.plan)
    first, second = (expert_edits(script, planned.mesh.place(r)) for r in (0, 1))
    assert not any(isinstance(e, Rotate) for e in first.edits)  # its experts come first
    rotated = [e for e in second.edits if isinstance(e, Rotate)]
    assert [(e.first, e.experts) for e in rotated] == [(2, 4), (2, 4)]  # one per layer
    assert all(e.kept == 2 for e in second.edits if isinstance(e, MaskRows))
    stacks = {b.tensors[0] for b in script.blocks}
    assert {w for w in second.weights if w.node in stacks} == {KeepRows(n, 2, 4) for n in stacks}


def test_a_remainder_goes_to_the_first_groups():
    ep = _hf.exported("qwen3_moe", num_experts=6)
    shards = fp.shard(ep, mesh=Mesh(ep=4), uneven="replicate")
    sizes = [s.state_dict[STACK].shape[0] for s in shards]
    assert sizes == [2, 2, 1, 1]


def test_separate_experts_leave_the_other_ranks():
    ep = exported(dtype=torch.float32, layers=1, moe_experts=4)
    shards = fp.shard(ep, 2)
    kept = [{k for k in s.state_dict if ".experts." in k} for s in shards]
    assert len(kept[0]) == len(kept[1]) == 6 and not kept[0] & kept[1]  # 2 experts x 3


def test_plans_whose_experts_are_not_the_programs(mixtral):
    ep, shards = mixtral
    data = shards.plan.to_dict()
    data["experts"][0]["experts"] = 8
    with pytest.raises(PlanError, match=r"the plan's experts of 'topk' \(8, 2 tensors\)"):
        fp.shard(ep, plan=data)
    data = analyze(ep, 2).to_dict()
    data["experts"][0]["router"] = "softmax"
    with pytest.raises(PlanError, match="splits the experts of 'softmax', but the program has"):
        fp.shard(ep, plan=data)


def test_the_pass_needs_a_plan():
    with pytest.raises(fp.PassFailedError, match="expert_parallel needs a plan"):
        fp.apply(_hf.exported("mixtral"), "expert_parallel{world_size=2,rank=0}")


def test_the_rewritten_routing_passes_the_metadata_check(mixtral):
    from fxpass.verify.invariants import check_metadata

    ep, shards = mixtral
    # (export leaves a higher-order op's submodule without a value: nothing new may miss one)
    assert set(check_metadata(shards[1].graph_module)) <= set(check_metadata(ep.graph_module))
    masks = [n for n in shards[1].graph.nodes if n.target is aten.where.ScalarOther]
    assert masks and all(n.meta["from_node"] for n in masks)
