"""The sharding rewrite: one rank's program from the global one and a plan.

``tensor_parallel`` is a registered pass. On a rank's copy of the graph it

* slices every sharded weight (and a column-parallel bias) to the rank's piece — in the
  ExportedProgram's state dict, in the module's attributes for ``get_attr`` weights, or,
  for graphs whose weights are inputs (AOT graphs inside ``torch.compile``), with slice
  nodes in the graph;
* rewrites the constants that mention global sizes: reshape and expand sizes (heads),
  slice bounds and split sizes of fused projections;
* inserts the collectives: an all-reduce after each row-parallel matmul (its bias, if any,
  is added after the reduction), masked lookups plus an all-reduce for a vocab-parallel
  embedding, an all-gather before the graph returns a sharded value;
* propagates ``meta['val']`` again through the whole graph with fake tensors.

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
from typing import Any

import torch
from torch import fx

from ..core.context import stat
from ..core.registry import _builtin
from ..edit.provenance import COPIED_META
from ..fxutil.paths import find_path
from ..rewrite.metadata import MetaPropagator
from ..targets.export import program_context
from . import collectives
from .analysis import check_world_size, collectives_of
from .layout import Shard, local_slice
from .plan import PlanError, ShardError, ShardPlan
from .propagate import Flow, Refused
from .sites import Params, Site, find_sites, target_of

__all__ = ["plan_flow", "rank_key", "resolve_rank", "shard_graph", "tensor_parallel"]

aten = torch.ops.aten


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


def _site_layouts(
    plan: ShardPlan, gm: fx.GraphModule, params: Params, sites: list[Site], world_size: int
) -> dict[fx.Node, Shard]:
    """The layout of every weight the plan cuts, checked against the graph."""
    if plan.world_size != world_size:
        raise PlanError(
            f"the plan was made for world size {plan.world_size}, not {world_size}; make a new "
            "plan or edit its world_size"
        )
    weights = params.by_name()
    nodes = {n.name: n for n in gm.graph.nodes}
    by_node = {s.node: s for s in sites}
    layouts: dict[fx.Node, Shard] = {}
    for d in plan.decisions:
        if d.param not in weights:
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
        site = by_node.get(nodes[d.node])
        if site is None or site.weight is not weights[d.param]:
            raise PlanError(f"node '{d.node}' does not use '{d.param}' as a weight")
        if (d.style == "vocab") != (site.kind == "embedding"):
            raise PlanError(f"'{d.param}' is read by a {site.kind}, which cannot be {d.style}")
        features = site.in_features if d.style == "row" else site.out_features
        if d.parts and sum(d.parts) != features:
            raise PlanError(f"the parts {d.parts} of '{d.param}' do not add up to {features}")
        parts = tuple(d.parts) if len(d.parts) > 1 else ()
        layouts[site.weight] = Shard(d.dim, parts=parts)
        if site.bias is not None and d.style == "column":
            layouts[site.bias] = Shard(0, parts=parts)
    return layouts


def _meta_from(new: fx.Node, old: fx.Node) -> None:
    for key in COPIED_META:
        if key in old.meta:
            new.meta.setdefault(key, old.meta[key])
    new.meta["fxpass_provenance"] = {"pass": "tensor_parallel", "replaced": [old.name]}


def _insert_after(node: fx.Node, build: Any) -> fx.Node:
    """Insert what ``build(graph)`` makes right after ``node``; move ``node``'s users to it."""
    graph = node.graph
    users = [u for u in node.users]
    with graph.inserting_before(node.next):  # (inserting_after would reverse the nodes)
        out = build(graph)
    for u in users:
        u.replace_input_with(node, out)
    created = []
    cursor = node.next
    while cursor is not out.next:
        created.append(cursor)
        cursor = cursor.next
    for n in created:
        _meta_from(n, node)
    return out


def _row(site: Site, group: str) -> None:
    """All-reduce a row-parallel matmul's partial sums; add its bias after the reduction."""
    node, bias = site.node, site.bias
    if bias is not None:
        if target_of(node) is aten.addmm.default:
            node.target = aten.mm.default
            node.args = node.args[1:]
        else:
            node.args = node.args[:2]
            node.kwargs = {k: v for k, v in node.kwargs.items() if k != "bias"}

    def build(graph: fx.Graph) -> fx.Node:
        out = collectives.all_reduce(graph, node, group)
        if bias is not None:
            out = graph.call_function(aten.add.Tensor, (out, bias))
        return out

    _insert_after(node, build)


def _embedding(site: Site, rank: int, world_size: int, group: str) -> None:
    """Vocab-parallel lookup: ids outside this rank's rows look up row 0 and are zeroed."""
    node = site.node
    rows = site.out_features // world_size
    start = rank * rows
    graph = node.graph
    ids = site.input
    with graph.inserting_before(node):
        ge = graph.call_function(aten.ge.Scalar, (ids, start))
        lt = graph.call_function(aten.lt.Scalar, (ids, start + rows))
        inside = graph.call_function(aten.logical_and.default, (ge, lt))
        shifted = graph.call_function(aten.sub.Tensor, (ids, start))
        local = graph.call_function(aten.mul.Tensor, (shifted, inside))
    for n in (ge, lt, inside, shifted, local):
        _meta_from(n, node)
    node.args = (node.args[0], local)  # padding_idx only matters for gradients
    node.kwargs = {}

    def build(graph: fx.Graph) -> fx.Node:
        # a product with the mask, not masked_fill: Inductor decomposes masked_fill before
        # its post-grad passes, where this rewrite may run
        mask = graph.call_function(aten.unsqueeze.default, (inside, -1))
        zeroed = graph.call_function(aten.mul.Tensor, (node, mask))
        return collectives.all_reduce(graph, zeroed, group)

    _insert_after(node, build)


def _gather(value: fx.Node, shard: Shard, world_size: int, group: str) -> None:
    graph = value.graph
    out = graph.output_node()
    local = list(value.meta["val"].shape)
    local[shard.dim] //= world_size
    anchor = out.prev
    with graph.inserting_before(out):
        full = collectives.all_gather(graph, value, local, shard.dim, world_size, group)
    out.replace_input_with(value, full)
    cursor = anchor.next
    while cursor is not out:
        _meta_from(cursor, value)
        cursor = cursor.next


# ----- weights -----------------------------------------------------------------------------
def _slice_in_graph(node: fx.Node, shard: Shard, rank: int, world_size: int) -> None:
    graph = node.graph
    size = int(node.meta["val"].shape[shard.dim])
    parts = shard.parts or (size,)
    users = list(node.users)
    with graph.inserting_before(node.next):
        pieces, start = [], 0
        for p in parts:
            chunk = p // world_size
            begin = start + rank * chunk
            pieces.append(
                graph.call_function(aten.slice.Tensor, (node, shard.dim, begin, begin + chunk))
            )
            start += p
        out = (
            pieces[0]
            if len(pieces) == 1
            else graph.call_function(aten.cat.default, (pieces, shard.dim))
        )
    for u in users:
        u.replace_input_with(node, out)


def _replace_weight(gm: fx.GraphModule, node: fx.Node, new: torch.Tensor) -> bool:
    """Put ``new`` where the graph keeps ``node``'s tensor; False when the graph has no
    tensor for it (its weights are inputs)."""
    ctx = program_context()
    if node.op == "get_attr":
        owner_path, _, attr = str(node.target).rpartition(".")
        owner = find_path(gm, owner_path) if owner_path else gm
        old = getattr(owner, attr)
        if isinstance(old, torch.nn.Parameter):
            new = torch.nn.Parameter(new, requires_grad=old.requires_grad)
        setattr(owner, attr, new)
        return True
    spec = ctx.input_spec(node) if ctx is not None else None
    if spec is None or spec.target is None:
        return False
    store = ctx.state_dict if spec.target in ctx.state_dict else ctx.constants
    old = store[spec.target]
    if isinstance(old, torch.nn.Parameter):
        new = torch.nn.Parameter(new, requires_grad=old.requires_grad)
    store[spec.target] = new
    return True


def _current(gm: fx.GraphModule, node: fx.Node) -> torch.Tensor | None:
    if node.op == "get_attr":
        value = find_path(gm, str(node.target))
        return value if isinstance(value, torch.Tensor) else None
    ctx = program_context()
    return ctx.value(node) if ctx is not None else None


def _fake_mode(gm: fx.GraphModule) -> Any:
    from torch._guards import detect_fake_mode
    from torch._subclasses.fake_tensor import FakeTensorMode

    vals = [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]
    mode = detect_fake_mode([v for v in vals if isinstance(v, torch.Tensor)])
    return mode or FakeTensorMode(allow_non_fake_inputs=True)


def _slice_weights(
    gm: fx.GraphModule, layouts: Mapping[fx.Node, Shard], rank: int, world_size: int, mode: Any
) -> tuple[int, int]:
    """Slice every sharded weight; returns (bytes before, bytes after) of those weights."""
    before = after = 0
    for node, shard in layouts.items():
        value = _current(gm, node)
        if value is None:
            _slice_in_graph(node, shard, rank, world_size)
            continue
        new = local_slice(value.detach(), shard, rank, world_size)
        before += value.numel() * value.element_size()
        after += new.numel() * new.element_size()
        _replace_weight(gm, node, new)
        node.meta["val"] = mode.from_tensor(new, static_shapes=True)
    return before, after


def _spec(val: Any) -> Any:
    if isinstance(val, torch.Tensor):
        return (tuple(val.shape), tuple(val.stride()), val.dtype)
    if isinstance(val, (list, tuple)):
        return tuple(_spec(v) for v in val)
    return val


def repropagate(gm: fx.GraphModule, mode: Any, changed: set[fx.Node] | None = None) -> None:
    """Recompute ``meta['val']`` where it may be stale: nodes without one, and every node
    downstream of a value whose metadata changed (``changed``: the weights sliced). Results
    are cached by op and input metadata, so a model's repeated layers cost one layer."""
    prop = MetaPropagator()
    prop.fake_mode = mode
    changed = set(changed or ())
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        stale = "val" not in node.meta or any(a in changed for a in node.all_input_nodes)
        if not stale:
            continue
        old = node.meta.pop("val", None)
        prop.values([node], {}, node)
        if "val" not in node.meta:  # the cache and the fake kernel could not say: be strict
            node.meta["val"] = fake_value(node.target, node.args, node.kwargs, mode=mode)
        if old is None or _spec(old) != _spec(node.meta["val"]):
            changed.add(node)


def fake_value(target: Any, args: Any, kwargs: Any, *, mode: Any) -> Any:
    """Run ``target`` on the fake values of its input nodes."""
    fargs, fkwargs = fx.node.map_arg((args, kwargs), lambda n: n.meta["val"])
    with mode:
        return target(*fargs, **fkwargs)


# ----- the pass --------------------------------------------------------------------------------
def plan_flow(
    gm: fx.GraphModule, params: Params, plan: ShardPlan, world_size: int
) -> tuple[dict[fx.Node, Shard], Flow]:
    """Check ``plan`` against the graph and follow it: the weights' layouts and the flow.
    A plan that does not fit raises :class:`PlanError`, an uneven one :class:`ShardError`."""
    sites = list(find_sites(gm, params))
    layouts = _site_layouts(plan, gm, params, sites, world_size)
    weights = {w: s for w, s in layouts.items() if any(x.weight is w for x in sites)}
    try:
        flow = Flow(gm, {s.node: s for s in sites}, weights, world_size).run()
    except Refused as e:
        raise PlanError(f"the plan does not fit the program: {e}") from None
    for req in flow.requirements:
        if req.units % world_size:
            raise ShardError(f"{req.what}: {req.units} cannot be split across {world_size} ranks")
    return layouts, flow


def shard_graph(
    gm: fx.GraphModule,
    plan: ShardPlan | None,
    rank: int,
    world_size: int,
    group: str = collectives.DEFAULT_GROUP,
) -> Flow:
    """Rewrite ``gm`` in place into ``rank``'s graph under ``plan`` (None: analyze it);
    returns the flow it applied."""
    from .analysis import _Analysis

    ctx = program_context()
    params = Params(gm, ctx.signature if ctx is not None else None)
    if plan is None:
        plan = _Analysis(gm, params, world_size, "error").run()
    layouts, flow = plan_flow(gm, params, plan, world_size)
    _apply(gm, flow, layouts, rank, world_size, group)
    return flow


def _apply(gm, flow: Flow, layouts, rank: int, world_size: int, group: str) -> None:
    summary = collectives_of(flow)
    for node, (where, key), value in flow.edits:
        if where == "args":
            node.update_arg(key, value)
        else:
            node.update_kwarg(key, value)
    for site in flow.partial:
        _row(site, group)
    for site in flow.embeddings:
        _embedding(site, rank, world_size, group)
    for value, shard in flow.gathers:
        _gather(value, shard, world_size, group)
    mode = _fake_mode(gm)
    before, after = _slice_weights(gm, layouts, rank, world_size, mode)
    repropagate(gm, mode, set(layouts))
    gm.graph.lint()
    stat("sharded_weights", len(layouts))
    stat("collectives", len(summary))
    stat("weight_bytes_unsharded", before)
    stat("weight_bytes_rank", after)


@_builtin(
    "tensor_parallel",
    statistics={
        "sharded_weights": "weights cut across ranks",
        "collectives": "collectives inserted",
        "weight_bytes_unsharded": "bytes of the sharded weights, whole",
        "weight_bytes_rank": "bytes of the sharded weights on this rank",
    },
)
def tensor_parallel(
    gm: fx.GraphModule,
    *,
    world_size: int = 0,
    rank: int = -1,
    plan: str = "",
    group: str = collectives.DEFAULT_GROUP,
) -> bool:
    """Shard the graph for one rank of a tensor-parallel group: slice the weights, rewrite
    head counts, insert functional collectives (see :mod:`fxpass.distributed.rewrite`).

    ``world_size`` and ``rank`` default to torch.distributed's (so the pass runs as is
    inside ``torch.compile`` on each rank); ``plan`` is a plan JSON file (default: analyze
    the graph); ``group`` names the process group (``"0"``: the default group).
    """
    world_size, rank = resolve_rank(world_size, rank)
    check_world_size(world_size)
    if world_size == 1:
        return False
    the_plan = plan if isinstance(plan, ShardPlan) else ShardPlan.load(plan) if plan else None
    shard_graph(gm, the_plan, rank, world_size, group)
    return True


def rank_key(*, world_size: int = 0, rank: int = -1, **_: Any) -> str:
    """What a rank-dependent pass adds to Inductor's cache key: the rank it will shard for
    (without it, ranks sharing a cache directory would run each other's compiled code)."""
    try:
        world_size, rank = resolve_rank(world_size, rank)
    except ShardError:
        return "rank unresolved"
    return f"rank {rank} of {world_size}"


tensor_parallel.cache_key = rank_key
