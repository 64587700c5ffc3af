"""pipeline_stages: a captured program cut by a cost model into ExportedPrograms that,
run one after the other, compute the original; one activation crosses each cut; bad
requests are one line naming the numbers."""

from __future__ import annotations

import pytest
import torch

import fxpass as fp
from fxpass.distributed import ShardError

from _models import decoder, exported

_hf = pytest.importorskip("_hf")


def _chain(stages, inputs):
    values = inputs
    for program in stages:
        values = program.module()(*values)
    return values


@pytest.mark.parametrize("moe", [0, 4])
def test_stages_compute_the_original(moe):
    ep = exported(dtype=torch.float32, moe_experts=moe)
    inputs = decoder(dtype=torch.float32, moe_experts=moe).example_inputs()
    stages = fp.pipeline_stages(ep, stages=2)
    assert len(stages) == 2 and all(isinstance(p, torch.export.ExportedProgram) for p in stages)
    (out,) = _chain(stages, inputs)
    assert torch.equal(out, ep.module()(*inputs))
    first, second = stages.stages
    assert first.sends == second.receives and len(second.receives) == 1  # one activation
    assert abs(first.weight_bytes - second.weight_bytes) < 0.1 * first.weight_bytes
    assert "2 pipeline stages" in str(stages)


def test_hugging_face_stages():
    ep = _hf.exported("llama")
    (logits,) = _chain(fp.pipeline_stages(ep, stages=2), _hf.example_inputs())
    assert torch.equal(logits, ep.module()(*_hf.example_inputs()).logits)


def test_a_plan_names_where_to_cut():
    ep = exported(dtype=torch.float32)
    stages = fp.pipeline_stages(ep, stages=2)
    again = fp.pipeline_stages(ep, stages=2, plan=stages.stages)
    assert again.stages == stages.stages
    shards = fp.shard(ep, pp=2)
    assert shards.plan.stages == stages.stages and shards.mesh.pp == 2


def test_more_stages_than_layers():
    with pytest.raises(ShardError) as e:
        fp.pipeline_stages(exported(dtype=torch.float32), stages=3)
    msg = str(e.value)
    assert msg.startswith("cannot cut the program into 3 pipeline stages: it has 2 layers")
    assert "use at most 2 stages" in msg and "\n" not in msg


@pytest.mark.parametrize(
    "program, stages, message",
    [
        ("ep", 0, "stages must be a positive integer, not 0"),
        ("gm", 2, "cut from a torch.export.ExportedProgram, not GraphModule"),
    ],
)
def test_bad_requests(program, stages, message):
    ep = exported(dtype=torch.float32, layers=1)
    target = ep if program == "ep" else ep.module()
    with pytest.raises(ShardError, match=message):
        fp.pipeline_stages(target, stages=stages)
