"""Making the plan: the one place the mesh is resolved, the strategies analyze the program,
the options are set and the program is cut into pipeline stages.

:func:`plan_shards` is what ``fxpass.shard`` and ``fxpass shard`` call, once; it returns a
:class:`Planned` — the program, the mesh, the plan and the stage programs — that
:func:`~.sharded.shard_planned` turns into one program per rank. :func:`analyze` is the
analysis alone: each strategy of the table (:func:`~.strategy.strategies`) fills its
section of the plan, in order.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import fx

from .analysis import check_world_size, mesh_for
from .mesh import Mesh, MeshError
from .plan import PlanError, ShardError, ShardPlan, plural
from .stages import PipelineStages
from .strategy import Survey, analyze_into, split_program

__all__ = ["Planned", "analyze", "as_plan", "plan_shards", "resolve_mesh"]


def analyze(
    program: torch.export.ExportedProgram | fx.GraphModule,
    world_size: int | None = None,
    *,
    mesh: Mesh | None = None,
    uneven: str = "error",
) -> ShardPlan:
    """Find the parallel structure of ``program`` and return the plan for ``world_size``
    ranks (the mesh :func:`~.analysis.choose_mesh` picks) or for ``mesh``: each strategy
    fills its section (:mod:`.analysis` says how tensor parallelism decides).

    ``uneven="error"`` (the default) refuses a group whose heads, features or rows the
    ranks do not divide, naming the layer and the numbers; ``"replicate"`` keeps such
    groups whole instead. Pipeline stages are cut by :func:`plan_shards`.
    """
    if uneven not in ("error", "replicate"):
        raise ValueError(f"uneven must be 'error' or 'replicate', not {uneven!r}")
    survey = Survey.of(program, uneven=uneven)
    if mesh is None:
        mesh = mesh_for(survey, world_size if world_size is not None else 0)
    elif world_size is not None and check_world_size(world_size) != mesh.world_size:
        raise ShardError(f"the mesh {mesh} has {mesh.world_size} ranks, not {world_size}")
    survey.mesh = mesh
    plan = ShardPlan(mesh)
    analyze_into(survey, plan)
    return plan


def resolve_mesh(
    world_size: int | None,
    mesh: Mesh | dict | str | None,
    tp: int | None,
    ep: int | None,
    pp: int | None,
    plan: ShardPlan | None,
) -> Mesh | None:
    """The mesh asked for (a mesh, dims, or the plan's), checked for agreement with each
    other and the world size; None for a world size alone (the program's analysis chooses:
    :func:`~.analysis.mesh_for`)."""
    try:
        if isinstance(mesh, str):
            mesh = Mesh.parse(mesh)
        elif isinstance(mesh, dict):
            mesh = Mesh.from_dict(mesh)
        if any(d is not None for d in (tp, ep, pp)):
            dims = Mesh(tp or 1, ep or 1, pp or 1)
            if mesh is not None and mesh != dims:
                raise ShardError(f"the mesh {mesh} and tp/ep/pp {dims} disagree")
            mesh = dims
    except MeshError as e:
        raise ShardError(str(e)) from None
    if world_size is not None:
        check_world_size(world_size)
    if mesh is not None and world_size is not None and mesh.world_size != world_size:
        raise ShardError(
            f"the mesh {mesh} has {plural(mesh.world_size, 'rank')}, not {world_size}; "
            "give one of them"
        )
    if plan is not None:
        if mesh is not None and plan.mesh != mesh:
            raise PlanError(
                f"the plan is for the mesh {plan.mesh} ({plural(plan.world_size, 'rank')}), "
                f"not {mesh} ({plural(mesh.world_size, 'rank')}); make a new plan or edit "
                "its mesh"
            )
        if mesh is None and world_size is not None and plan.world_size != world_size:
            raise PlanError(
                f"the plan was made for world size {plan.world_size} ({plan.mesh}), not "
                f"{world_size}; make a new plan or edit its mesh"
            )
        return plan.mesh
    if mesh is None and world_size is None:
        raise ShardError("give the number of ranks (world_size), a mesh, or tp/ep/pp")
    return mesh


def as_plan(plan: Any) -> ShardPlan | None:
    """A plan given as a :class:`ShardPlan`, its JSON as a dict, or a JSON file."""
    if plan is None or isinstance(plan, ShardPlan):
        return plan
    if isinstance(plan, dict):
        return ShardPlan.from_dict(plan)
    if isinstance(plan, (str, Path)):
        return ShardPlan.load(plan)
    raise PlanError(f"plan must be a ShardPlan, a dict or a JSON file, not {type(plan).__name__}")


@dataclass
class Planned:
    """A plan made for a program: the ``program``, its ``plan`` (its ``mesh``), and the
    programs of its pipeline stages (``stages``; None without pipeline stages). With one
    rank the plan is empty and there is nothing to shard."""

    program: Any
    plan: ShardPlan
    stages: PipelineStages | None = None

    @property
    def mesh(self) -> Mesh:
        return self.plan.mesh

    def programs(self) -> list[Any]:
        """The program of each stage (the program itself without stages)."""
        return list(self.stages) if self.stages is not None else [self.program]


def plan_shards(
    program: Any,
    world_size: int | None = None,
    *,
    mesh: Mesh | dict | str | None = None,
    tp: int | None = None,
    ep: int | None = None,
    pp: int | None = None,
    plan: ShardPlan | dict | str | Path | None = None,
    sequence_parallel: bool | None = None,
    fuse: bool | None = None,
    bucket: int | bool | None = None,
    async_tp: int | None = None,
    gates: dict[str, Any] | None = None,
    uneven: str = "error",
) -> Planned:
    """The plan for sharding ``program`` (arguments as for :func:`~.sharded.shard`): the
    mesh resolved, the plan read or made (:func:`analyze`), the options given set over the
    plan's, and the program cut by every strategy that splits it (pipeline stages) — each
    step once."""
    the_plan = as_plan(plan)
    survey = Survey.of(program, uneven=uneven)  # the program as every step sees it
    asked = resolve_mesh(world_size, mesh, tp, ep, pp, the_plan)
    survey.mesh = asked if asked is not None else mesh_for(survey, world_size)
    made = the_plan is None or survey.mesh.world_size == 1
    if made:  # with one rank, an empty plan: nothing to shard
        the_plan = ShardPlan(survey.mesh)
    if survey.mesh.world_size == 1:
        the_plan.set_options(fuse=True if fuse else None)
        return Planned(program, the_plan)
    the_plan.set_options(sequence_parallel, fuse, bucket, async_tp, gates)
    if made:
        analyze_into(survey, the_plan)
    return Planned(program, the_plan, split_program(survey, the_plan))
