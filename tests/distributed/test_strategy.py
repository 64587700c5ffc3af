"""The table of strategies (:mod:`fxpass.distributed.strategy`) and the one planning step
(:mod:`fxpass.distributed.planning`): every step reads the table, planning happens once, the
rank rewrites are handed their context and take typed options."""

from __future__ import annotations

import pytest
import torch

import fxpass as fp
from fxpass.core.contract import FunctionPass
from fxpass.distributed import PlanError, ShardPlan, plan_shards, shard_planned, strategies
from fxpass.distributed import stages as stages_module
from fxpass.distributed.tensor_parallel import TensorParallelRank, TensorScript, tensor_parallel


class _Blocks(torch.nn.Module):
    """Four residual MLP blocks: tensor-parallel, and cut into pipeline stages between them."""

    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.ModuleList(torch.nn.Linear(16, 32, bias=False) for _ in range(4))
        self.down = torch.nn.ModuleList(torch.nn.Linear(32, 16, bias=False) for _ in range(4))

    def forward(self, x):
        for up, down in zip(self.up, self.down):
            x = x + down(torch.relu(up(x)))
        return x


@pytest.fixture(scope="module")
def program():
    torch.manual_seed(0)
    return torch.export.export(_Blocks(), (torch.randn(4, 16),))


def test_the_table_is_every_strategy_module_in_order():
    assert [s.name for s in strategies()] == ["pipeline_stages", "tensor_parallel",
                                              "expert_parallel"]  # fmt: skip
    sections = [s.section.name for s in strategies() if s.section is not None]
    assert sections == ["stages", "decisions", "experts"]


def test_the_plan_reads_and_writes_the_sections_the_table_names(program):
    plan = fp.distributed.analyze(program, 2)
    data = plan.to_dict()
    assert {"stages", "decisions", "experts"} <= set(data)
    assert ShardPlan.from_dict(data) == plan
    assert plan.sections["decisions"] is plan.decisions
    data["tiles"] = []
    with pytest.raises(PlanError, match="unknown key 'tiles'"):
        ShardPlan.from_dict(data)


def test_planning_resolves_the_mesh_and_cuts_the_stages_once(program, monkeypatch):
    cuts = []
    real = stages_module.pipeline_stages

    def counted(*args, **kwargs):
        cuts.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(stages_module, "pipeline_stages", counted)
    planned = plan_shards(program, tp=2, pp=2, sequence_parallel=True)
    assert len(cuts) == 1 and len(planned.stages) == 2 and len(planned.plan.stages) == 2
    assert planned.plan.options["sequence_parallel"]
    shards = shard_planned(planned)
    assert len(cuts) == 1  # building the ranks cuts nothing again
    assert shards.world_size == 4 and shards.stages is planned.stages
    x = torch.randn(4, 16)
    assert torch.allclose(planned.stages[1].module()(planned.stages[0].module()(x)[0])[0],
                          program.module()(x), atol=1e-5)  # fmt: skip


def test_the_rank_rewrite_is_typed_and_handed_its_context(program):
    planned = plan_shards(program, 2)
    shards = shard_planned(planned)
    record = shards.reports[1].find("tensor_parallel")
    assert record.modified and record.stats["collectives"] == 4
    # the weights the rewrite sliced are the rank's program's, read from ctx.program
    assert shards.rank_bytes(1) == fp.distributed.weight_bytes(program) // 2
    rank_pass = TensorParallelRank(TensorScript(), planned.mesh.place(0))
    assert rank_pass.name == "tensor_parallel"


def test_the_registered_pass_takes_a_plan_file_not_an_object(program):
    smuggled = FunctionPass(tensor_parallel, "tensor_parallel",
                            options={"world_size": 2, "rank": 0, "plan": TensorScript()})  # fmt: skip
    with pytest.raises(Exception, match="plan is a plan JSON file, not TensorScript"):
        fp.apply(program, fp.Pipeline([smuggled]))
