"""Parallelism for captured programs: find the parallel structure of a graph, plan it over a
mesh (tensor, expert and pipeline parallelism), and make one program per rank that runs on
torch.distributed — its collectives fused where they can be.

>>> shards = fxpass.shard(exported_program, world_size=2)        # doctest: +SKIP
>>> shards.plan                     # every decision, with its reason; editable JSON  # doctest: +SKIP
>>> shards[0]                       # rank 0's ExportedProgram (its weights sliced)  # doctest: +SKIP
>>> shards.save("out")              # rank0.pt2, rank1.pt2, manifest.json  # doctest: +SKIP
>>> fxpass.shard(exported_program, tp=2, ep=2, pp=2)               # doctest: +SKIP

Modules: :mod:`~.strategy` (the table of strategies: each one module's ``STRATEGY``),
:mod:`~.planning` (the plan made once: mesh, analysis, options, stage cut),
:mod:`~.mesh` (ranks and groups), :mod:`~.plan` (the plan as data),
:mod:`~.placement` (how a tensor is cut), :mod:`~.sites` (where weights are used),
:mod:`~.rules`, :mod:`~.partial` and :mod:`~.propagate` (how slices and partial sums go
through ops), :mod:`~.analysis` (tensor parallelism), :mod:`~.experts` (mixtures of
experts), :mod:`~.stages` (stages by a cost model), :mod:`~.collectives`,
:mod:`~.edit_script` (a rank's edits as data and the one executor that applies them),
:mod:`~.edits` (the kinds of edit),
:mod:`~.weights` (where a weight's tensor lives), the passes
:mod:`~.tensor_parallel`, :mod:`~.expert_parallel`, :mod:`~.sequence_parallel` and
:mod:`~.fuse_allreduce_add_rmsnorm`, :mod:`~.bucket_collectives` and :mod:`~.async_tp`
(the plan's options, gated by size: :mod:`~.shard_options`), :mod:`~.consistency` (every rank
issues the same collectives), :mod:`~.accounting` (collectives and bytes per layer against
the minimum), and :mod:`~.sharded` (the entry point). See docs/distributed.md.
"""

from __future__ import annotations

from . import (  # noqa: F401  (registers the passes)
    async_tp,
    bucket_collectives,
    expert_parallel,
    fuse_allreduce_add_rmsnorm,
    sequence_parallel,
    tensor_parallel,
)
from .analysis import choose_mesh
from .mesh import Mesh
from .plan import Decision, ExpertBlock, PlanError, ShardError, ShardPlan, Stage
from .planning import Planned, analyze, plan_shards
from .sharded import (
    ShardedPrograms,
    init_groups,
    load_rank,
    load_stage,
    shard,
    shard_planned,
    weight_bytes,
)
from .stages import PipelineStages, pipeline_stages
from .strategy import Strategy, strategies

__all__ = [
    "Decision",
    "ExpertBlock",
    "Mesh",
    "PipelineStages",
    "PlanError",
    "Planned",
    "ShardError",
    "ShardPlan",
    "ShardedPrograms",
    "Stage",
    "Strategy",
    "analyze",
    "choose_mesh",
    "init_groups",
    "load_rank",
    "load_stage",
    "pipeline_stages",
    "plan_shards",
    "shard",
    "shard_planned",
    "strategies",
    "weight_bytes",
]
