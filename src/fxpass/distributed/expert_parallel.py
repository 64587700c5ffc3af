"""The ``expert_parallel`` pass: each rank keeps the experts of its expert group.

For every mixture of experts the plan splits (:mod:`.experts` finds them), on the rank of
expert group ``g`` holding experts ``[lo, hi)``:

* the expert stacks keep rows ``lo .. hi`` (``experts / ep`` of them, the first
  ``experts % ep`` groups one more);
* the router's expert ids, on their way to the experts, are rotated, ``(id - lo) mod E``
  (what else reads them — routing weights gathered by id — keeps the router's numbering),
  so this rank's experts are
  ``0 .. hi - lo`` and sort first: a grouped matmul runs them on their rows with the first
  ``hi - lo`` offsets, and leaves the other rows alone;
* ids that gather from an expert stack (biases, batched expert matmuls) are clamped into
  the kept rows;
* where the rows leave the experts, the rows of other groups' experts are zeroed, so what
  leaves is this group's partial sum — all-reduced by ``tensor_parallel`` where its full
  value is needed (the plan lists it among the collectives).

:func:`expert_edits` works these edits out for one rank as data (an
:class:`~.edit_script.EditScript`); :func:`~.edit_script.apply_edits` applies them.

Routing weights are left as they are, so top-k with or without normalised weights and
shared experts (tensor-parallel as any MLP) compute what the single process computes.

Before / after, rank 1 of 2, 4 experts (Mixtral in fp32)::

    %topk = aten.topk(%softmax, 2)
    %ids = getitem(%topk, 1)
    ...
    %gmm = transformers.grouped_mm_fallback(%x, %w_gate_up, %offsets)     # w: [4, 64, 256]
    ...
    %rows = aten.mul(%gmm_1, %routing)
    %back = aten.index(%rows, [%inverse])
                        ->
    %ids = getitem(%topk, 1)
    %sub = aten.sub(%ids, 2)
    %remainder = aten.remainder(%sub, 4)                   # what takes ids to the experts reads this
    ...
    %slice = aten.slice(%offsets, 0, 0, 2)
    %gmm = transformers.grouped_mm_fallback(%x, %w_gate_up, %slice)        # w: [2, 64, 256]
    ...
    %lt = aten.lt(%sorted_ids, 2)
    %where = aten.where(%lt_view, %rows, 0.0)
    %back = aten.index(%where, [%inverse])
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx

from ..core.context import PassContext
from ..core.pass_registry import REGISTRY
from .analysis import expert_decisions
from .edit_script import EditScript, apply_edits
from .edits import Clamp, FirstOffsets, KeepRows, MaskRows, Rotate, ZeroExpert
from .experts import Block, find_blocks
from .mesh import Mesh, Place, expert_range
from .plan import ExpertBlock, PlanError, ShardPlan
from .sites import Params
from .strategy import Section, Strategy, StrategyPass, Survey, handed_context
from .tensor_parallel import rank_key, resolve_rank

__all__ = [
    "STRATEGY",
    "BlockScript",
    "ExpertParallelRank",
    "ExpertScript",
    "apply_experts",
    "expert_edits",
    "expert_parallel",
    "expert_script",
]

aten = torch.ops.aten
RULE = "expert_parallel"


@dataclass
class BlockScript:
    """One block by node name (see :class:`fxpass.distributed.experts.Block`)."""

    ids: str
    experts: int
    tensors: list[str]
    grouped: list[str]
    gathers: list[str]
    exits: list[tuple[str, str]]
    routed: list[str] = field(default_factory=list)  # readers of ids that reach the experts
    whole: bool = False  # the experts are not cut over tp: one rank of each group counts
    mlps: list[tuple[str, list[str]]] = field(default_factory=list)  # separate experts

    @classmethod
    def of(cls, block: Block, whole: bool) -> BlockScript:
        return cls(
            block.ids.name,
            block.experts,
            [t.name for t in block.tensors],
            [g.name for g in block.grouped],
            [g.name for g in block.gathers],
            [(v.name, i.name) for v, i in block.exits],
            [u.name for u in block.routed],
            whole,
            [(y.name, [n.name for n in body]) for y, body in block.mlps],
        )


@dataclass
class ExpertScript:
    """What every rank's ``expert_parallel`` applies, over ``mesh``."""

    mesh: Mesh
    blocks: list[BlockScript] = field(default_factory=list)

    @property
    def partial(self) -> list[str]:
        """The values that hold each rank's partial sums (before they are masked)."""
        return [v for b in self.blocks for v, _ in b.exits]


def expert_script(
    gm: fx.GraphModule, params: Params, plan: ShardPlan, *, stage: bool = False
) -> ExpertScript:
    """Check the plan's expert blocks against the graph (``stage``: one pipeline stage,
    holding some of them): each must be a block the graph has, with the same experts."""
    script = ExpertScript(plan.mesh)
    if plan.mesh.ep == 1:
        return script
    found, refused = find_blocks(gm, params)
    by_router = {b.router.name: b for b in found}
    nodes = {n.name for n in gm.graph.nodes}
    for planned in plan.experts:
        block = by_router.get(planned.router)
        if block is None:
            if stage and planned.router not in nodes:
                continue
            why = next((r for r in refused if r.startswith(f"'{planned.router}'")), None)
            raise PlanError(
                f"the plan splits the experts of '{planned.router}', but the program has no "
                f"such mixture of experts{f' ({why})' if why else ''}"
            )
        names = [params.name(t) for t in block.tensors]
        if planned.experts != block.experts or sorted(planned.weights) != sorted(names):
            raise PlanError(
                f"the plan's experts of '{planned.router}' ({planned.experts}, "
                f"{len(planned.weights)} tensors) are not the program's ({block.experts}, "
                f"{len(names)} tensors)"
            )
        cut = {d.param for d in plan.decisions if d.sharded}
        stacks = [t for t in block.tensors if t.meta["val"].dim() == 3]
        whole = (
            plan.mesh.tp > 1 and not block.mlps and not all(params.name(t) in cut for t in stacks)
        )
        script.blocks.append(BlockScript.of(block, whole))
    return script


def _kept(b: BlockScript, place: Place) -> tuple[int, int]:
    """The experts ``[lo, hi)`` of ``b`` the rank at ``place`` keeps: of its expert group,
    or, for separate experts, of its stage's ranks."""
    if b.mlps:
        return expert_range(b.experts, place.size, place.local)
    return expert_range(b.experts, place.mesh.ep, place.expert_group)


def expert_edits(script: ExpertScript, place: Place) -> EditScript:
    """What the rank at ``place`` changes of its graph under ``script``, as data (applied by
    :func:`~.edit_script.apply_edits`)."""
    out = EditScript()
    for b in script.blocks:
        lo, hi = _kept(b, place)
        if b.mlps:  # separate experts, split whole over the stage's ranks: the others' give zeros
            out.edits += [
                ZeroExpert(y, tuple(reversed(body[:-1] if body[-1] == y else body)))
                for e, (y, body) in enumerate(b.mlps)
                if not lo <= e < hi
            ]
            continue
        kept = hi - lo
        if lo:  # rotate: this group's experts first
            out.edits.append(Rotate(b.ids, lo, b.experts, tuple(b.routed)))
        out.edits += [Clamp(name, kept - 1) for name in b.gathers]
        out.edits += [FirstOffsets(name, kept) for name in b.grouped]
        # experts kept whole on each of the group's tp ranks: one of them counts their rows
        counted = 0 if b.whole and place.tp_index else kept
        out.edits += [MaskRows(value, by, counted) for value, by in b.exits]
        out.weights += [KeepRows(name, lo, hi) for name in b.tensors]
    return out


def apply_experts(gm: fx.GraphModule, script: ExpertScript, place: Place, ctx: Any) -> int:
    """Rewrite ``gm`` for the rank at ``place``: its edits worked out
    (:func:`expert_edits`) and applied through the run's editor (``ctx.editor``), keeping
    the rank's experts of the program it runs on (``ctx.program``); returns how many
    blocks were split."""
    edits = expert_edits(script, place)
    apply_edits(gm, edits, ctx, RULE)
    for b in script.blocks:
        lo, hi = _kept(b, place)
        ctx.stat("experts_kept", hi - lo)
        ctx.stat("experts_whole", b.experts)
    return len(script.blocks)


STATISTICS = {
    "blocks": "mixtures of experts split across expert groups",
    "experts_kept": "experts this rank keeps (summed over blocks)",
    "experts_whole": "experts of the blocks split (summed over blocks)",
}


@REGISTRY.register("expert_parallel", origin="fxpass", statistics=STATISTICS)
def expert_parallel(
    gm: fx.GraphModule,
    *,
    world_size: int = 0,
    rank: int = -1,
    plan: str = "",
    ctx: PassContext | None = None,
) -> bool:
    """Keep this rank's experts of every mixture of experts the plan splits, rotate the
    routing so they come first, and zero the other experts' rows where they leave (see
    :mod:`fxpass.distributed.expert_parallel`). ``plan`` is a plan JSON file (from
    ``fxpass shard``); ``world_size`` and ``rank`` default to torch.distributed's."""
    world_size, rank = resolve_rank(world_size, rank)
    if not isinstance(plan, str):
        raise TypeError(f"expert_parallel: plan is a plan JSON file, not {type(plan).__name__}")
    if not plan:
        raise PlanError("expert_parallel needs a plan (a JSON file from fxpass shard)")
    ctx = handed_context(ctx, "expert_parallel")
    signature = ctx.program.signature if ctx.program is not None else None
    script = expert_script(gm, Params(gm, signature), ShardPlan.load(plan))
    if script.mesh.world_size != world_size:
        raise PlanError(f"the plan is for the mesh {script.mesh}, not {world_size} ranks")
    if not script.blocks:
        return False
    ctx.stat("blocks", apply_experts(gm, script, script.mesh.place(rank), ctx))
    return True


# ----- the strategy ----------------------------------------------------------------------------
class ExpertParallelRank(StrategyPass):
    """One rank's expert-parallel rewrite in ``fxpass.shard``: the stage's script and the
    rank's place, typed (the registered ``expert_parallel`` reads a plan file instead)."""

    name = "expert_parallel"
    statistics = STATISTICS

    def __init__(self, script: ExpertScript, place: Place) -> None:
        self.script, self.place = script, place

    def execute(self, gm: fx.GraphModule, ctx: Any) -> bool:
        ctx.stat("blocks", apply_experts(gm, self.script, self.place, ctx))
        return True


class ExpertParallelStrategy(Strategy):
    """Expert parallelism: each rank of a stage keeps its share of every mixture of
    experts' experts."""

    name = "expert_parallel"
    order = 20
    section = Section("experts", ExpertBlock)

    def analyze(self, survey: Survey, plan: ShardPlan) -> list[ExpertBlock]:
        return expert_decisions(survey, plan)

    def prepare(self, survey: Survey, plan: ShardPlan, scripts: Any) -> ExpertScript | None:
        script = expert_script(survey.gm, survey.params, plan, stage=survey.staged)
        return script if script.blocks else None

    def rewrite(self, script: ExpertScript, place: Place) -> ExpertParallelRank:
        return ExpertParallelRank(script, place)


STRATEGY = ExpertParallelStrategy()


expert_parallel.cache_key = rank_key
