"""Find the tensor-parallel structure of a graph, without its model source.

The analysis looks at every linear, grouped and embedding site (:mod:`fxpass.distributed.sites`)
and groups the linear ones by the value they read (looking through reshapes): q, k and v
read the same normed hidden state, gate and up read the next one. For each group it tries
the Megatron layout — cut the group's weights along their output features and follow the
slices forward (:class:`~fxpass.distributed.propagate.Flow`): through head reshapes,
rotary embeddings, per-head norms, attention (any spelling: SDPA, or matmul + softcap +
mask + softmax, with sinks), activations and the gate product, until each slice meets a
linear that contracts it (row-parallel: its partial sums are all-reduced) or the graph's
output (all-gathered, as for an lm_head). An RMSNorm over the whole sharded projection
(Olmo3's q/k norms) becomes a distributed norm — each rank sums its squares, one small
all-reduce — and a weight that meets the slice (the norm's scale, attention sinks) is
sliced with it. Where a slice meets an op that cannot take it — a router's softmax or top-k
over the experts — the sites it came from stay replicated, with what that costs each rank,
and the rest of the group is tried again. Fused projections (one linear for q/k/v, or
gate/up) are recognised by how their output is sliced, and each part is cut separately.
Embeddings are cut along the vocabulary (masked lookups, then an all-reduce). The experts
of a mixture of experts are split across expert groups (:mod:`.experts`) and their stacked
weights cut along their features over the group's ranks (``ways``).

Every decision records why: which nodes, which dim, and what the world size must divide.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch
from torch import fx

from ..fxutil.fx_internals import sort_key
from .experts import Block, find_blocks
from .mesh import Mesh, expert_range
from .placement import Shard
from .plan import Decision, ExpertBlock, ShardError, ShardPlan, plural
from .propagate import Flow, Refused, Requirement
from .sites import SAME_VALUE, Params, Site, find_sites, target_of

__all__ = [
    "check_world_size",
    "choose_mesh",
    "collectives_of",
    "expert_blocks",
    "expert_decisions",
    "mesh_for",
    "tensor_decisions",
    "weight_nbytes",
]

aten = torch.ops.aten

_SAME_VALUE = SAME_VALUE
_SPLITS = {aten.split.Tensor, aten.split_with_sizes.default, aten.chunk.default}


def check_world_size(world_size: Any) -> int:
    """``world_size`` if it is a positive integer, else a one-line :class:`ShardError`."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ShardError(
            f"world size must be a positive integer (the number of ranks), not {world_size!r}"
        )
    return world_size


def _root(node: Any) -> Any:
    while isinstance(node, fx.Node) and node.op == "call_function":
        if target_of(node) not in _SAME_VALUE:
            break
        node = node.args[0]
    return node


def _last_dim(node: fx.Node, dim: Any) -> bool:
    val = node.args[0].meta.get("val") if isinstance(node.args[0], fx.Node) else None
    return val is not None and dim in (-1, val.dim() - 1)


def _pieces(value: fx.Node, features: int) -> list[tuple[int, int]] | None:
    """The [start, end) ranges of the last dim that ``value``'s users take, or None when a
    user takes all of it."""
    out: list[tuple[int, int]] = []
    for user in value.users:
        op = target_of(user) if user.op == "call_function" else None
        val = user.meta.get("val")
        if op in _SAME_VALUE and isinstance(val, torch.Tensor) and val.shape[-1] == features:
            sub = _pieces(user, features)
            if sub is None:
                return None
            out += sub
        elif op is aten.slice.Tensor and _last_dim(user, user.args[1]):
            start = user.args[2] if len(user.args) > 2 else 0
            end = min(user.args[3] if len(user.args) > 3 else features, features)
            if len(user.args) > 4 and user.args[4] != 1:
                return None
            out.append((start, end))
        elif op in _SPLITS and _last_dim(user, user.args[2] if len(user.args) > 2 else 0):
            start = 0
            for piece in val:
                out.append((start, start + int(piece.shape[-1])))
                start += int(piece.shape[-1])
        else:
            return None
    return out


def fused_parts(site: Site) -> tuple[int, ...]:
    """The parts a fused projection's output is sliced into (q/k/v, gate/up), or ()."""
    features = site.out_features
    pieces = _pieces(site.node, features)
    if not pieces:
        return ()
    ranges = sorted(set(pieces))
    if ranges[0][0] != 0 or ranges[-1][1] != features or len(ranges) < 2:
        return ()
    for (_, end), (start, _) in itertools.pairwise(ranges):
        if end != start:
            return ()
    return tuple(end - start for start, end in ranges)


def _layer(params: Params, site: Site) -> str:
    name = params.name(site.weight)
    parts = name.split(".")
    return ".".join(parts[:-2]) if len(parts) > 2 else name


def weight_nbytes(node: fx.Node) -> int:
    val = node.meta.get("val")
    return int(val.numel() * val.element_size()) if isinstance(val, torch.Tensor) else 0


class _Analysis:
    def __init__(
        self, gm: fx.GraphModule, params: Params, mesh: Mesh, uneven: str, blocks: list[Block]
    ):
        self.gm, self.params, self.mesh, self.uneven = gm, params, mesh, uneven
        self.n = mesh.stage_size
        self.blocks = blocks
        self.seeds = [v for b in blocks for v, _ in b.exits] if mesh.ep > 1 else []
        experts = {t for b in blocks for t in b.tensors} if mesh.ep > 1 else set()
        listed = {t for b in blocks if b.mlps for t in b.tensors} & experts
        self.sites = [
            s
            for s in find_sites(gm, params)
            if (s.kind != "grouped" or mesh.tp > 1 or not experts) and s.weight not in listed
        ]
        self.by_node = {s.node: s for s in self.sites}
        self.weights: dict[fx.Node, Shard] = {}
        self.decisions: dict[fx.Node, Decision] = {}
        self.parts = {s: fused_parts(s) if s.kind != "embedding" else () for s in self.sites}

    def ways(self, site: Site) -> int:
        """Grouped (expert) weights are cut over the ``tp`` ranks of an expert group."""
        if site.kind == "grouped" and self.mesh.tp != self.n:
            return self.mesh.tp
        return 0

    def _foreign_user(self, weight: fx.Node) -> fx.Node | None:
        """A user of ``weight`` that is not one of its sites (it would read a slice)."""
        inside = {s.node for s in self.sites} | {p for s in self.sites for p in s.path}
        gathers = {g for b in self.blocks for g in b.gathers}
        return next((u for u in weight.users if u not in inside | gathers), None)

    def groups(self) -> list[list[Site]]:
        by_root: dict[Any, list[Site]] = {}
        for s in self.sites:
            key = ("embedding", s.weight) if s.kind == "embedding" else _root(s.input)
            by_root.setdefault(key, []).append(s)
        return list(by_root.values())

    def run(self) -> tuple[list[Decision], list[dict[str, Any]]]:
        """The decisions, in graph order, and the collectives they imply."""
        for group in self.groups():
            self._group(group)
        for s in self.sites:  # sites no group reached (their input was never sharded)
            if s.weight not in self.decisions:
                self._replicate(s, "its input is replicated and it does not open a group")
        flow = self.flow(dict(self.weights)).run()
        nodes = {n.name: n for n in self.gm.graph.nodes}
        decisions = sorted(self.decisions.values(), key=lambda d: sort_key(nodes[d.node]))
        return decisions, collectives_of(flow)

    def flow(self, weights: dict[fx.Node, Shard], discover: bool = False) -> Flow:
        return Flow(self.gm, self.by_node, weights, self.n, discover, self.params,
                    self.seeds if not discover else ())  # fmt: skip

    def _group(self, group: list[Site]) -> None:
        todo = []
        for s in group:
            if s.weight in self.decisions:
                continue
            user = self._foreign_user(s.weight)
            ways = self.ways(s) or self.n
            if user is not None:
                self._replicate(s, f"the weight is also read by '{user.name}' ({target_of(user)})")
            elif s.kind != "embedding" and s.out_features < ways:  # a gate's one output
                self._replicate(s, f"its {plural(s.out_features, 'output feature')} are fewer "
                                f"than the {ways} ranks")  # fmt: skip
            else:
                todo.append(s)
        while todo:
            try:
                flow = self._trial(todo)
            except Refused as r:
                bad = [s for s in todo if s in r.sources] or list(todo)
                for s in bad:
                    style = {"embedding": "vocab", "batched": "batch"}.get(s.kind, "column")
                    self._replicate(s, f"not {style}-parallel: {r}")
                todo = [s for s in todo if s not in bad]
                continue
            if self._uneven(flow, todo):
                continue
            self._record(flow, todo)
            return

    def _trial(self, todo: list[Site]) -> Flow:
        weights = {s.weight: self._cut(s) for s in todo}
        flow = self.flow(weights, discover=True)
        for s in todo:
            experts = int(s.weight.meta["val"].shape[0])
            for p in (experts,) if s.kind == "batched" else self.parts[s] or (s.out_features,):
                what = f"'{self.params.name(s.weight)}' has {p} " + (
                    {"embedding": "rows", "batched": "experts"}.get(s.kind, "output features")
                )
                flow.requirements.append(Requirement(s.node, p, what, frozenset({s}), self.ways(s)))
        flow.run()
        for row in flow.rows:
            if row.weight in self.decisions or self._foreign_user(row.weight) is not None:
                raise Refused(
                    row.node, f"'{row.node.name}' cannot be row-parallel", frozenset(todo)
                )
        for w in flow.companions:
            if w in self.decisions or w in self.weights:
                raise Refused(w, f"'{w.name}' is already cut another way", frozenset(todo))
        return flow

    def _cut(self, s: Site) -> Shard:
        if s.kind == "batched":
            return Shard(0)
        return Shard(s.out_dim, parts=self.parts[s], ways=self.ways(s))

    def _uneven(self, flow: Flow, todo: list[Site]) -> bool:
        for req in flow.requirements:
            ways = req.ways or self.n
            if req.units % ways == 0:
                continue
            site = next(iter(req.sources), todo[0])
            layer = _layer(self.params, site)
            if self.uneven == "error":
                raise ShardError(
                    f"cannot split {layer} evenly across {plural(ways, 'rank')}: {req.what} "
                    f"({req.units} is not a multiple of {ways}); use a world size that "
                    f"divides {req.units}, or keep it whole with uneven='replicate'"
                )
            for s in todo:
                self._replicate(s, f"uneven: {req.what}, not a multiple of {ways}")
            todo.clear()
            return True
        return False

    def _record(self, flow: Flow, todo: list[Site]) -> None:
        self.weights.update(flow.weights)
        for s in todo:
            self._decide(s, flow)
        for row in flow.rows:
            cols = sorted({c.node.name for c in flow.sources.get(row.node, ())})
            closing = (
                f"all-reduce after '{row.node.name}'"
                if row.kind != "grouped"
                else "its partial sums all-reduced where they combine"
            )
            shard = flow.weights[row.weight]
            self.decisions[row.weight] = Decision(
                self.params.name(row.weight),
                "row",
                row.node.name,
                dim=row.in_dim,
                parts=list(shard.parts),
                bias=self.params.name(row.bias) if row.bias is not None else None,
                reason=(
                    f"row-parallel: reads '{row.input.name}' cut along its features (from "
                    f"{', '.join(repr(c) for c in cols)}); {closing}"
                ),
                ways=shard.ways,
            )
        for b in flow.batched:
            self.decisions[b.weight] = self._batch(b)
        for w, node in flow.companions.items():
            shard = flow.weights[w]
            self.decisions[w] = Decision(
                self.params.name(w),
                "slice",
                node.name,
                dim=shard.dim,
                parts=list(shard.parts),
                reason=(
                    f"sliced with '{node.name}', which reads it against a value cut along its "
                    f"dim {flow.layouts[node].dim if node in flow.layouts else shard.dim} "
                    "(a per-feature or per-head weight)"
                ),
                ways=shard.ways,
            )

    def _decide(self, s: Site, flow: Flow) -> None:
        name = self.params.name(s.weight)
        if s.kind == "embedding":
            rows = s.out_features
            reason = (
                f"vocab-parallel: each rank looks up {rows // self.n} of {rows} rows; the masked "
                f"lookups are all-reduced after '{s.node.name}'"
            )
            self.decisions[s.weight] = Decision(name, "vocab", s.node.name, reason=reason)
            return
        if s.kind == "batched":
            self.decisions[s.weight] = self._batch(s)
            return
        detail = sorted(
            (r for r in flow.requirements if s in r.sources and r.node is not s.node),
            key=lambda r: r.units,
        )
        closed = [r.node.name for r in flow.rows if s in flow.sources.get(r.node, ())]
        gathered = [v.name for v, _ in flow.gathers if s in flow.sources.get(v, ())]
        why = [f"column-parallel: reads replicated '{_root(s.input).name}'"]
        if detail:  # the tightest cut (heads rather than features)
            why.append(detail[0].what)
        if closed:
            why.append("closed by row-parallel " + ", ".join(repr(c) for c in closed))
        if gathered:
            why.append("all-gathered before the graph returns " + ", ".join(map(repr, gathered)))
        self.decisions[s.weight] = Decision(
            name,
            "column",
            s.node.name,
            dim=s.out_dim,
            parts=list(self.parts[s]),
            bias=self.params.name(s.bias) if s.bias is not None else None,
            reason="; ".join(why),
            ways=self.ways(s),
        )

    def _batch(self, s: Site) -> Decision:
        experts = int(s.weight.meta["val"].shape[0])
        reason = (
            f"cut by expert: each rank runs {experts // self.n} of the {experts} experts of "
            f"'{s.node.name}' on every token; their sum over the experts is all-reduced"
        )
        return Decision(self.params.name(s.weight), "batch", s.node.name, dim=0, reason=reason)

    def _replicate(self, s: Site, reason: str) -> None:
        if s.weight in self.decisions:
            return
        nbytes = weight_nbytes(s.weight)
        cost = f"; costs each rank {nbytes:,} bytes it could share" if self.n > 1 else ""
        self.decisions[s.weight] = Decision(
            self.params.name(s.weight),
            "replicate",
            s.node.name,
            reason=f"replicated: {reason}{cost}",
            bytes=nbytes,
        )


def collectives_of(flow: Flow) -> list[dict[str, Any]]:
    """The collectives a flow implies, with the global shape and bytes of each."""
    out = []

    def entry(op: str, node: fx.Node, **extra: Any) -> dict[str, Any]:
        val = node.meta.get("val")
        shape = list(val.shape) if isinstance(val, torch.Tensor) else []
        nbytes = val.numel() * val.element_size() if isinstance(val, torch.Tensor) else 0
        return {"op": op, "node": node.name, "shape": shape, "bytes": int(nbytes), **extra}

    placed = []
    for s in flow.embeddings:
        placed.append((s.node, entry("all_reduce", s.node)))
    for s in flow.partial:
        placed.append((s.node, entry("all_reduce", s.node)))
    for r in flow.reductions:
        extra = {"reduce": r.op} if r.op != "sum" else {}
        placed.append((r.value, entry("all_reduce", r.value, **extra)))
    for value, shard in flow.gathers:
        placed.append((value, entry("all_gather", value, dim=shard.dim)))
    placed.sort(key=lambda p: sort_key(p[0]))
    out = [e for _, e in placed]
    return out


def choose_mesh(program: Any, world_size: int) -> Mesh:
    """The mesh :func:`~.planning.analyze` picks for ``world_size`` ranks: a mixture of
    experts splits its experts across as many groups as divide both (the rest of the ranks
    cut each expert's features), everything else is tensor-parallel."""
    from .strategy import Survey

    return mesh_for(Survey.of(program), world_size)


def mesh_for(survey: Any, world_size: int) -> Mesh:
    """:func:`choose_mesh` for a surveyed program (its expert blocks found once)."""
    world_size = check_world_size(world_size)
    blocks, _ = _found(survey)
    if not blocks or world_size == 1:
        return Mesh(tp=world_size)
    experts = min(b.experts for b in blocks)
    ep = max((d for d in range(1, world_size + 1) if world_size % d == 0 and experts % d == 0),
             default=1)  # fmt: skip
    if ep == 1 and experts >= world_size:
        ep = world_size  # no common divisor: some groups take one expert more
    return Mesh(tp=world_size // ep, ep=ep)


def _found(survey: Any) -> tuple[list[Block], list[str]]:
    return survey.fact("expert_blocks", lambda sv: find_blocks(sv.gm, sv.params))


def expert_blocks(survey: Any) -> list[Block]:
    """The mixtures of experts of the surveyed program (found once per survey: the mesh's
    choice and both parallelisms read them), checked against the mesh when it splits
    experts."""
    blocks, refused = _found(survey)
    if survey.mesh.ep > 1:
        _check_experts(survey.mesh, blocks, refused)
    return blocks


def tensor_decisions(survey: Any, plan: ShardPlan) -> list[Decision]:
    """The tensor-parallel decisions of the surveyed program (see the module docstring);
    the collectives they imply go to ``plan.collectives``."""
    blocks = expert_blocks(survey)
    decisions, collectives = _Analysis(survey.gm, survey.params, survey.mesh, survey.uneven,
                                       blocks).run()  # fmt: skip
    plan.collectives = collectives
    return decisions


def expert_decisions(survey: Any, plan: ShardPlan) -> list[ExpertBlock]:
    """The mixtures of experts split across expert groups (none on a mesh with ``ep`` 1)."""
    if survey.mesh.ep == 1:
        return []
    return [b.describe(survey.params, survey.mesh.stage_size) for b in expert_blocks(survey)]


def _check_experts(mesh: Mesh, blocks: list[Block], refused: list[str]) -> None:
    if not blocks:
        why = f" ({refused[0]})" if refused else ""
        raise ShardError(
            f"ep {mesh.ep} splits experts, but the program has no mixture of experts that "
            f"can be split{why}; use tp instead"
        )
    for b in blocks:
        lo, hi = expert_range(b.experts, mesh.ep, mesh.ep - 1)
        if hi - lo < 1:
            raise ShardError(
                f"cannot split the {plural(b.experts, 'expert')} of '{b.router.name}' across "
                f"ep {mesh.ep} groups: each group needs at least one expert; use ep <= "
                f"{b.experts}"
            )
