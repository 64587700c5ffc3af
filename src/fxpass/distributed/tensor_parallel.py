"""The ``tensor_parallel`` pass: one rank's program from the global one and a plan.

The plan is checked against the graph and followed once (:func:`tensor_script`: every
weight's layout, every constant to rewrite, every collective, by node name — what each rank
applies); then, for each rank, :func:`rank_edits` works out that rank's edits as data, the
graph only read (an :class:`~.edit_script.EditScript`), and one executor,
:func:`~.edit_script.apply_edits`, applies them to the rank's copy of the graph. Each rank

* slices every sharded weight (and a column-parallel bias, and the weights sliced with the
  activations they meet) to the rank's piece — in the ExportedProgram's state dict, in the
  module's attributes for ``get_attr`` weights, or, for graphs whose weights are inputs
  (AOT graphs inside ``torch.compile``), with slice nodes in the graph;
* rewrites the constants that mention global sizes: reshape and expand sizes (heads),
  slice bounds and split sizes of fused projections;
* inserts the collectives: an all-reduce after each row-parallel matmul (its bias, if any,
  is added after the reduction), masked lookups plus an all-reduce for a vocab-parallel
  embedding, an all-reduce of each distributed reduction (an RMSNorm's sum of squares) and
  of partial sums where they are needed whole, an all-gather before the graph returns a
  sharded value;
* propagates ``meta['val']`` again through the graph with fake tensors.

Every change goes through :class:`fxpass.edit.Editor`, so the debug counter, the report's
change list and provenance (``from_node``) see each collective; the collectives' nodes come
from :mod:`.collectives`' builders.

Before / after, for attention on rank 0 of 2 (HF Llama, 4 heads of 16)::

    %linear = aten.linear(%x, %q_proj_weight)           # [1, 8, 64]     q_proj: [64, 64]
    %view = aten.view(%linear, [1, 8, 4, 16])
    ...
    %linear_3 = aten.linear(%reshape_3, %o_proj_weight)  # [1, 8, 64]
                        ->
    %linear = aten.linear(%x, %q_proj_weight)           # [1, 8, 32]     q_proj: [32, 64]
    %view = aten.view(%linear, [1, 8, 2, 16])
    ...
    %linear_3 = aten.linear(%reshape_3, %o_proj_weight)  # [1, 8, 64] partial sums
    %all_reduce = _c10d_functional.all_reduce(%linear_3, "sum", "0")
    %wait_tensor = _c10d_functional.wait_tensor(%all_reduce)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx

from ..core.context import PassContext
from ..core.pass_registry import REGISTRY
from . import collectives
from .analysis import check_world_size, collectives_of, tensor_decisions
from .edit_script import EditScript, apply_edits
from .edits import Bypass, Gather, MaskedLookup, Reduce, SetArg, SliceWeight, TakePiece
from .mesh import Mesh, Place
from .placement import Shard
from .plan import Decision, PlanError, ShardError, ShardPlan, plural
from .propagate import Flow, Refused
from .sites import Params, Site, find_sites
from .strategy import Section, Strategy, StrategyPass, Survey, handed_context

__all__ = [
    "STRATEGY",
    "TensorParallelRank",
    "TensorScript",
    "apply_script",
    "rank_edits",
    "rank_key",
    "resolve_rank",
    "tensor_parallel",
    "tensor_script",
]

aten = torch.ops.aten
RULE = "tensor_parallel"


def resolve_rank(world_size: int, rank: int) -> tuple[int, int]:
    """``(world_size, rank)``, taking what is unset (0 and -1) from torch.distributed."""
    if world_size <= 0 or rank < 0:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            raise ShardError(
                "tensor_parallel needs world_size and rank: pass them as options, or "
                "initialize torch.distributed first"
            )
        world_size = world_size if world_size > 0 else dist.get_world_size()
        rank = rank if rank >= 0 else dist.get_rank()
    if not 0 <= rank < world_size:
        raise ShardError(f"rank {rank} is not in a world of size {world_size}")
    return world_size, rank


# ----- the plan, checked and followed once ------------------------------------------------------
@dataclass
class TensorScript:
    """The tensor-parallel rewrite of one graph by node name: what every rank applies."""

    layouts: dict[str, Shard] = field(default_factory=dict)  # weight node -> layout
    edits: list[tuple[str, tuple[str, Any], Any]] = field(default_factory=list)
    rows: list[tuple[str, str | None]] = field(default_factory=list)  # (matmul, bias)
    embeddings: list[tuple[str, int]] = field(default_factory=list)  # (lookup, rows)
    reductions: list[tuple[str, str, float, list[str]]] = field(default_factory=list)
    gathers: list[tuple[str, Shard]] = field(default_factory=list)
    rank0_adds: list[str] = field(default_factory=list)
    collectives: list[dict[str, Any]] = field(default_factory=list)
    mesh: Mesh | None = None
    local_slices: list[tuple[str, str, Shard]] = field(default_factory=list)  # (reader, value)

    @classmethod
    def of(cls, flow: Flow, layouts: Mapping[fx.Node, Shard], mesh: Mesh) -> TensorScript:
        return cls(
            {n.name: s for n, s in layouts.items()},
            [(n.name, where, value) for n, where, value in flow.edits],
            [(s.node.name, s.bias.name if s.bias is not None else None) for s in flow.partial],
            [(s.node.name, s.out_features) for s in flow.embeddings],
            [(r.value.name, r.op, r.scale, [u.name for u in r.users]) for r in flow.reductions],
            [(v.name, s) for v, s in flow.gathers],
            [n.name for n in flow.rank0_adds],
            collectives_of(flow),
            mesh,
            [(r.name, v.name, sh) for r, v, sh in flow.local_slices],
        )


def _site_layouts(
    plan: ShardPlan, gm: fx.GraphModule, params: Params, sites: list[Site], stage: bool
) -> dict[fx.Node, Shard]:
    """The layout of every weight the plan cuts, checked against the graph (``stage``:
    the graph is one pipeline stage, holding some of the plan's weights)."""
    weights = params.by_name()
    nodes = {n.name: n for n in gm.graph.nodes}
    by_node = {s.node: s for s in sites}
    layouts: dict[fx.Node, Shard] = {}
    for d in plan.decisions:
        if d.param not in weights:
            if stage:
                continue
            raise PlanError(
                f"the plan names the weight '{d.param}', which the program does not have "
                "(was the plan made for another program?)"
            )
        if d.node not in nodes:
            raise PlanError(
                f"the plan says node '{d.node}' reads '{d.param}', but the program has no "
                f"node '{d.node}'"
            )
        if not d.sharded:
            continue
        if d.ways not in (0, plan.mesh.tp):
            raise PlanError(
                f"'{d.param}' is cut {d.ways} ways, but the mesh's tp is {plan.mesh.tp}"
            )
        weight = weights[d.param]
        parts = tuple(d.parts) if len(d.parts) > 1 else ()
        if d.style == "slice":
            if d.dim >= len(weight.meta["val"].shape):
                raise PlanError(f"'{d.param}' has no dim {d.dim} to slice")
            layouts[weight] = Shard(d.dim, parts=parts, ways=d.ways)
            continue
        site = by_node.get(nodes[d.node])
        if site is None or site.weight is not weight:
            raise PlanError(f"node '{d.node}' does not use '{d.param}' as a weight")
        if (d.style == "vocab") != (site.kind == "embedding") or (d.style == "batch") != (
            site.kind == "batched"
        ):
            raise PlanError(f"'{d.param}' is read by a {site.kind}, which cannot be {d.style}")
        want = {"row": site.in_dim, "batch": 0}.get(d.style, site.out_dim)
        if d.dim != want:
            raise PlanError(f"a {d.style} cut of '{d.param}' is along dim {want}, not {d.dim}")
        features = site.in_features if d.style == "row" else site.out_features
        if d.parts and sum(d.parts) != features:
            raise PlanError(f"the parts {d.parts} of '{d.param}' do not add up to {features}")
        layouts[weight] = Shard(d.dim, parts=parts, ways=d.ways)
        if site.bias is not None and d.style == "column":
            layouts[site.bias] = Shard(0, parts=parts, ways=d.ways)
    return layouts


def tensor_script(
    gm: fx.GraphModule,
    params: Params,
    plan: ShardPlan,
    *,
    partial: list[str] = (),
    stage: bool = False,
) -> TensorScript:
    """Check ``plan`` against the graph and follow it: what each rank's rewrite applies.
    ``partial`` names the values that hold partial sums (each rank's experts' rows). A
    plan that does not fit raises :class:`PlanError`, an uneven one :class:`ShardError`."""
    sites = list(find_sites(gm, params))
    layouts = _site_layouts(plan, gm, params, sites, stage)
    biases = {s.bias for s in sites if s.bias is not None} - {s.weight for s in sites}
    weights = {w: s for w, s in layouts.items() if w not in biases}  # biases follow sites
    nodes = {n.name: n for n in gm.graph.nodes}
    size = plan.mesh.stage_size
    try:
        flow = Flow(gm, {s.node: s for s in sites}, weights, size, params=params,
                    partial_seeds=[nodes[n] for n in partial if n in nodes]).run()  # fmt: skip
    except Refused as e:
        raise PlanError(f"the plan does not fit the program: {e}") from None
    for req in flow.requirements:
        ways = req.ways or size
        if req.units % ways:
            raise ShardError(
                f"{req.what}: {req.units} cannot be split across {plural(ways, 'rank')}"
            )
    return TensorScript.of(flow, layouts, plan.mesh)


# ----- one rank's edits --------------------------------------------------------------------------
def rank_edits(gm: fx.GraphModule, script: TensorScript, place: Place) -> EditScript:
    """What the rank at ``place`` changes of ``gm`` under ``script``, as data: the numbers of
    its pieces worked out, the graph only read (:func:`~.edit_script.apply_edits` applies
    them)."""
    nodes = {n.name: n for n in gm.graph.nodes}
    group = place.group
    out = EditScript([SetArg(name, where, value) for name, where, value in script.edits])
    if place.tp_index:  # a bias added to partial sums: one rank of each expert group adds it
        out.edits += [Bypass(name) for name in script.rank0_adds]
    out.edits += [Reduce(name, group, bias=bias) for name, bias in script.rows]
    for name, rows in script.embeddings:
        local = rows // place.size
        start = place.local * local
        out.edits.append(MaskedLookup(name, start, start + local, group))
    out.edits += [Reduce(name, group, op, scale, tuple(users))
                  for name, op, scale, users in script.reductions]  # fmt: skip
    for name, shard in script.gathers:
        _, count = place.piece(shard.ways)
        local = list(nodes[name].meta["val"].shape)
        local[shard.dim] //= count
        out.edits.append(Gather(name, shard.dim, tuple(local), count, group))
    for reader, value, shard in script.local_slices:
        index, count = place.piece(shard.ways)
        size = int(nodes[value].meta["val"].shape[shard.dim]) // count
        out.edits.append(TakePiece(reader, value, shard.dim, index * size, (index + 1) * size))
    out.weights = [SliceWeight(name, shard, *place.piece(shard.ways))
                   for name, shard in script.layouts.items()]  # fmt: skip
    return out


def apply_script(gm: fx.GraphModule, script: TensorScript, place: Place, ctx: Any) -> None:
    """Rewrite ``gm`` in place into the graph of the rank at ``place`` (see the module
    docstring): the rank's edits worked out (:func:`rank_edits`), then applied through the
    run's editor (``ctx.editor``), slicing the weights of the program it runs on
    (``ctx.program``)."""
    edits = rank_edits(gm, script, place)
    before, after = apply_edits(gm, edits, ctx, RULE)
    ctx.stat("sharded_weights", len(script.layouts))
    ctx.stat("collectives", len(script.collectives))
    ctx.stat("weight_bytes_unsharded", before)
    ctx.stat("weight_bytes_rank", after)


# ----- the pass --------------------------------------------------------------------------------
def script_for(gm: fx.GraphModule, plan: ShardPlan | None, world_size: int,
               program: Any) -> TensorScript:  # fmt: skip
    """The script of ``plan`` (None: analyze the graph) for ``gm`` of ``program`` (the
    run's ``PassContext.program``: which placeholders are weights)."""
    params = Params(gm, program.signature if program is not None else None)
    if plan is None:  # tensor parallelism alone: its section of a plan made here
        plan = ShardPlan(Mesh(tp=world_size))
        plan.decisions = tensor_decisions(Survey(gm, gm, params, plan.mesh), plan)
    if plan.world_size != world_size:
        raise PlanError(
            f"the plan was made for the mesh {plan.mesh}, not {plural(world_size, 'rank')}; "
            "make a new plan or edit its mesh"
        )
    if plan.mesh.pp > 1 or plan.mesh.ep > 1:
        raise PlanError(
            f"the plan's mesh {plan.mesh} has pipeline stages or expert groups: shard the "
            "program with fxpass.shard, which runs every strategy"
        )
    return tensor_script(gm, params, plan)


STATISTICS = {
    "sharded_weights": "weights cut across ranks",
    "collectives": "collectives inserted",
    "weight_bytes_unsharded": "bytes of the sharded weights, whole",
    "weight_bytes_rank": "bytes of the sharded weights on this rank",
}


@REGISTRY.register(
    "tensor_parallel",
    origin="fxpass",
    keeps=("val", "stack_trace", "nn_module_stack", "provenance"),
    statistics=STATISTICS,
)
def tensor_parallel(
    gm: fx.GraphModule,
    *,
    world_size: int = 0,
    rank: int = -1,
    plan: str = "",
    group: str = collectives.DEFAULT_GROUP,
    ctx: PassContext | None = None,
) -> bool:
    """Shard the graph for one rank of a tensor-parallel group: slice the weights, rewrite
    head counts, insert functional collectives (see :mod:`fxpass.distributed.tensor_parallel`).

    ``world_size`` and ``rank`` default to torch.distributed's (so the pass runs as is
    inside ``torch.compile`` on each rank); ``plan`` is a plan JSON file (default: analyze
    the graph); ``group`` names the process group (``"0"``: the default group).
    """
    world_size, rank = resolve_rank(world_size, rank)
    check_world_size(world_size)
    if world_size == 1:
        return False
    if not isinstance(plan, str):
        raise TypeError(f"tensor_parallel: plan is a plan JSON file, not {type(plan).__name__}")
    ctx = handed_context(ctx, "tensor_parallel")
    script = script_for(gm, ShardPlan.load(plan) if plan else None, world_size, ctx.program)
    mesh = script.mesh or Mesh(tp=world_size)
    named = group != collectives.DEFAULT_GROUP and mesh.pp == 1
    apply_script(gm, script, mesh.place(rank, group if named else None), ctx)
    return True


# ----- the strategy ----------------------------------------------------------------------------
class TensorParallelRank(StrategyPass):
    """One rank's tensor-parallel rewrite in ``fxpass.shard``: the stage's script and the
    rank's place, typed (the registered ``tensor_parallel`` reads a plan file instead)."""

    name = "tensor_parallel"
    keeps = frozenset({"val", "stack_trace", "nn_module_stack", "provenance"})
    statistics = STATISTICS

    def __init__(self, script: TensorScript, place: Place) -> None:
        self.script, self.place = script, place

    def execute(self, gm: fx.GraphModule, ctx: Any) -> bool:
        apply_script(gm, self.script, self.place, ctx)
        return True


class TensorParallelStrategy(Strategy):
    """Tensor parallelism: each rank of a stage keeps a piece of every weight the plan's
    decisions cut, with the collectives that put the pieces back together."""

    name = "tensor_parallel"
    order = 10
    section = Section("decisions", Decision, required=True)

    def analyze(self, survey: Survey, plan: ShardPlan) -> list[Decision]:
        return tensor_decisions(survey, plan)

    def prepare(self, survey: Survey, plan: ShardPlan, scripts: Any) -> TensorScript | None:
        if plan.mesh.stage_size == 1:
            return None
        experts = scripts["expert_parallel"]
        partial = experts.partial if experts is not None else []
        return tensor_script(survey.gm, survey.params, plan, partial=partial, stage=survey.staged)

    def rewrite(self, script: TensorScript, place: Place) -> TensorParallelRank:
        return TensorParallelRank(script, place)


STRATEGY = TensorParallelStrategy()


def rank_key(*, world_size: int = 0, rank: int = -1, **_: Any) -> str:
    """What a rank-dependent pass adds to Inductor's cache key: the rank it will shard for
    (without it, ranks sharing a cache directory would run each other's compiled code)."""
    try:
        world_size, rank = resolve_rank(world_size, rank)
    except ShardError:
        return "rank unresolved"
    return f"rank {rank} of {world_size}"


tensor_parallel.cache_key = rank_key
