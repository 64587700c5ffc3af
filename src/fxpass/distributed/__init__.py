"""Tensor parallelism for captured programs: find the parallel structure of a graph, plan,
shard it into one program per rank running on torch.distributed, and fuse the collectives.

>>> shards = fxpass.shard(exported_program, world_size=2)        # doctest: +SKIP
>>> shards.plan                     # every decision, with its reason; editable JSON
>>> shards[0]                       # rank 0's ExportedProgram (its weights sliced)
>>> shards.save("out")              # rank0.pt2, rank1.pt2, manifest.json

Modules: :mod:`~.layout` (how a tensor is cut), :mod:`~.sites` (where weights are used),
:mod:`~.rules` and :mod:`~.propagate` (how slices go through ops), :mod:`~.analysis`,
:mod:`~.plan`, :mod:`~.collectives`, :mod:`~.rewrite` (the ``tensor_parallel`` pass),
:mod:`~.sequence_parallel` and :mod:`~.fuse_allreduce_add_rmsnorm` (library passes on
sharded graphs), :mod:`~.sharded` (the entry point). See docs/distributed.md.
"""

from __future__ import annotations

from . import (  # noqa: F401  (registers tensor_parallel, sequence_parallel and the fusion)
    fuse_allreduce_add_rmsnorm,
    rewrite,
    sequence_parallel,
)
from .analysis import analyze
from .plan import Decision, PlanError, ShardError, ShardPlan
from .sharded import ShardedPrograms, load_rank, shard, weight_bytes

__all__ = [
    "Decision",
    "PlanError",
    "ShardError",
    "ShardPlan",
    "ShardedPrograms",
    "analyze",
    "load_rank",
    "shard",
    "weight_bytes",
]
