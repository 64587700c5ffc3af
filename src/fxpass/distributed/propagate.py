"""Follow sharded weights through a graph: which values end up sharded, where partial sums
must be all-reduced, which constants change, and what the world size must divide.

Given the layout of some weights (column-parallel: cut along their output features;
row-parallel: their input features; vocab-parallel embeddings: their rows), :class:`Flow`
walks forward from the sites that read them, in graph order, visiting only values that are
sharded. Each op goes through its rule (:mod:`fxpass.distributed.rules`). A row-parallel
linear turns its sharded input into partial sums, all-reduced right there; the partial
sums of a grouped (expert) matmul, of the experts a rank owns, or of a reduction over the
sharded dim go on through the ops that are linear in them (:mod:`fxpass.distributed.partial`)
and are all-reduced before the first op that is not. A sharded value the graph returns is
all-gathered. A replicated weight that meets a sharded value along the sharded dim — a
q/k norm's per-feature scale, attention sinks, an expert bias — is sliced with it (a
*companion*). An op that cannot take a slice stops the walk with :class:`Refused`, naming
the node, the reason and the column sites it came from.

The analysis runs a flow per group of candidate sites (``discover=True`` lets it find the
row-parallel sites that close them and the companions); the rewrite applies one flow with
the whole plan.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx

from ..fxutil.fx_internals import sort_key
from .partial import WEIGHT_CHAIN, partial_rule
from .placement import PARTIAL, NotShardable, Shard
from .rules import rule_for
from .sites import Params, Site, target_of

__all__ = ["Flow", "Reduction", "Refused", "Requirement"]


class Refused(Exception):
    """The walk met an op that cannot take a slice; ``sources`` are the column sites whose
    values reached it."""

    def __init__(self, node: fx.Node, reason: str, sources: frozenset[Site]) -> None:
        super().__init__(reason)
        self.node = node
        self.sources = sources


@dataclass
class Requirement:
    """The number of ranks a value is cut over (``ways``; 0: the world size) must divide
    ``units`` (heads, features, rows) for ``what``."""

    node: fx.Node
    units: int
    what: str
    sources: frozenset[Site]
    ways: int = 0


@dataclass
class Reduction:
    """An all-reduce of ``value`` (``op``: ``"sum"``, ``"max"``, ``"min"``; times ``scale``
    afterwards) for the ``users`` that need the full value (all of them when empty)."""

    value: fx.Node
    op: str = "sum"
    scale: float = 1.0
    users: list[fx.Node] = field(default_factory=list)


@dataclass
class Flow:
    """One propagation of weight layouts through ``gm`` (see the module docstring)."""

    gm: fx.GraphModule
    sites: Mapping[fx.Node, Site]
    weights: dict[fx.Node, Shard]
    world_size: int
    discover: bool = False
    params: Params | None = None
    partial_seeds: Iterable[fx.Node] = ()
    layouts: dict[fx.Node, Any] = field(default_factory=dict)
    sources: dict[fx.Node, frozenset[Site]] = field(default_factory=dict)
    partial: list[Site] = field(default_factory=list)
    embeddings: list[Site] = field(default_factory=list)
    rows: list[Site] = field(default_factory=list)
    gathers: list[tuple[fx.Node, Shard]] = field(default_factory=list)
    edits: list[tuple[fx.Node, tuple[str, Any], Any]] = field(default_factory=list)
    requirements: list[Requirement] = field(default_factory=list)
    reductions: list[Reduction] = field(default_factory=list)
    companions: dict[fx.Node, fx.Node] = field(default_factory=dict)  # weight -> where it met
    rank0_adds: list[fx.Node] = field(default_factory=list)
    batched: list[Site] = field(default_factory=list)  # discovered batch (expert) cuts
    local_slices: list[tuple[fx.Node, fx.Node, Shard]] = field(default_factory=list)
    _current: fx.Node | None = None
    _heap: list = field(default_factory=list)
    _seen: set = field(default_factory=set)
    _reduced: dict = field(default_factory=dict)

    # ----- what rules use ------------------------------------------------------------------
    def layout(self, arg: Any) -> Any:
        if not isinstance(arg, fx.Node):
            return None
        lay = self.layouts.get(arg)
        if lay is PARTIAL:
            done = self._reduced.get(arg)
            if done is not None and (not done.users or self._current in done.users):
                return None  # this reader takes the all-reduced value
        return lay

    def shape(self, node: fx.Node) -> tuple[int, ...]:
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            raise NotShardable(f"'{node.name}' has no tensor value (meta['val'])")
        return tuple(int(s) for s in val.shape)

    def op(self, node: fx.Node) -> Any:
        return target_of(node)

    def edit(self, node: fx.Node, where: tuple[str, Any], value: Any) -> None:
        self.edits.append((node, where, value))

    def ways(self, shard: Shard) -> int:
        """How many pieces ``shard`` is cut into."""
        return shard.ways or self.world_size

    def require(self, node: fx.Node, units: int, what: str, ways: int = 0) -> None:
        srcs = self.sources.get(self._current, frozenset()) if self._current else frozenset()
        self.requirements.append(Requirement(node, units, what, srcs, ways))

    def reduce(self, node: fx.Node, op: str, scale: float = 1.0) -> None:
        """``node`` computed a local reduction over the sharded dim: all-reduce it."""
        self.reductions.append(Reduction(node, op, scale))

    def companion(self, node: fx.Node, operand: fx.Node, shard: Shard) -> None:
        """Make the replicated ``operand`` of ``node`` carry ``shard`` by slicing the weight
        it is read from (through casts, views, expands and gathers that nothing else reads);
        raises :class:`NotShardable` when it is not read from one."""
        chain = self._chain(node, operand)
        weight = chain[0]
        for candidate in self._candidates(weight, shard):
            if self._try_chain(chain, candidate) == shard:
                self.weights[weight] = candidate
                self.companions[weight] = node
                return
        raise NotShardable(
            f"'{node.name}' combines a sharded value with the replicated '{operand.name}', "
            f"which spans the sharded dim {shard.dim} (size {self.shape(operand)[shard.dim]})"
        )

    def _chain(self, node: fx.Node, operand: fx.Node) -> list[fx.Node]:
        chain, cur = [operand], operand
        while not (self.params is not None and self.params.is_weight(cur)):
            if cur.op != "call_function" or target_of(cur) not in WEIGHT_CHAIN:
                raise NotShardable(
                    f"'{node.name}' combines a sharded value with the replicated "
                    f"'{operand.name}', which spans the sharded dim and is not read from a weight"
                )
            cur = cur.args[0]
            chain.insert(0, cur)
        allowed = set(chain) | {node}
        for i, n in enumerate(chain):
            if any(u not in allowed for u in n.users) or (i and n.args[0] is not chain[i - 1]):
                raise NotShardable(
                    f"'{node.name}' reads '{operand.name}' from the weight '{chain[0].name}', "
                    "which other ops read whole"
                )
        if chain[0] in self.weights and self.weights[chain[0]] is not None:
            raise NotShardable(f"the weight '{chain[0].name}' is already cut another way")
        return chain

    def _candidates(self, weight: fx.Node, shard: Shard) -> list[Shard]:
        out = []
        for d in range(len(self.shape(weight))):
            for outer, parts in ((shard.outer, shard.parts), (1, shard.parts), (1, ())):
                out.append(Shard(d, outer, parts, shard.ways))
        return list(dict.fromkeys(out))

    def _try_chain(self, chain: list[fx.Node], shard: Shard) -> Any:
        marks = (len(self.edits), len(self.requirements))
        saved = {n: self.layouts.get(n) for n in chain}
        self.layouts[chain[0]] = shard
        try:
            for n in chain[1:]:
                lay = rule_for(self.op(n))(self, n)
                if lay is None:
                    raise NotShardable("lost")
                self.layouts[n] = lay
            return self.layouts[chain[-1]]
        except (NotShardable, TypeError):
            del self.edits[marks[0] :], self.requirements[marks[1] :]
            for n, lay in saved.items():
                if lay is None:
                    self.layouts.pop(n, None)
                else:
                    self.layouts[n] = lay
            return None

    # ----- the walk -----------------------------------------------------------------------------
    def run(self, seeds: Iterable[fx.Node] | None = None) -> Flow:
        """Walk from ``seeds`` (default: every site whose weight has a layout, every other
        weight with a layout, and the partial seeds)."""
        site_weights = {s.weight for s in self.sites.values()}
        if seeds is None:
            seeds = [s.node for s in self.sites.values() if s.weight in self.weights]
            for w, shard in self.weights.items():
                if w not in site_weights:  # a companion given by the plan
                    self.layouts[w] = shard
                    seeds += list(w.users)
            for node in self.partial_seeds:
                self.layouts[node] = PARTIAL
                seeds += list(node.users)
        self._heap = [(sort_key(n), n.name, n) for n in set(seeds)]
        heapq.heapify(self._heap)
        self._seen = {n for _, _, n in self._heap}
        while self._heap:
            _, _, node = heapq.heappop(self._heap)
            self._current = node
            self.sources[node] = self._sources_of(node)
            layout = self._visit(node)
            if layout is None:
                continue
            self.layouts[node] = layout
            for user in node.users:
                if user not in self._seen:
                    self._seen.add(user)
                    heapq.heappush(self._heap, (sort_key(user), user.name, user))
        self._current = None
        return self

    def _sources_of(self, node: fx.Node) -> frozenset[Site]:
        site = self.sites.get(node)
        if site is not None and site.weight in self.weights:
            return frozenset({site})
        out: frozenset[Site] = frozenset()
        for a in node.all_input_nodes:
            out |= self.sources.get(a, frozenset())
        return out

    def refuse(self, node: fx.Node, reason: str) -> Refused:
        return Refused(node, reason, self.sources.get(node, frozenset()))

    def _visit(self, node: fx.Node) -> Any:
        site = self.sites.get(node)
        try:
            if site is not None:
                self._reduce_partial_inputs(node)
                return self._site(site)
            if node.op == "output":
                self._reduce_partial_inputs(node)
                return self._output(node)
            if node.op != "call_function":
                raise NotShardable(f"'{node.name}' ({node.op}) reads a sharded value")
            if any(self.layout(a) is PARTIAL for a in node.all_input_nodes):
                if self.op(node) is torch.ops.aten._assert_tensor_metadata.default:
                    return None  # checks dtype and device: a partial sum has the sum's
                out = partial_rule(self, node)
                if out is not None:
                    return out
                self._reduce_partial_inputs(node)
            if all(self.layout(a) is None for a in node.all_input_nodes):
                return None
            rule = rule_for(self.op(node))
            if rule is None:
                raise NotShardable(
                    f"'{node.name}' ({self.op(node)}) cannot take a slice of "
                    f"{', '.join(repr(a.name) for a in node.all_input_nodes if a in self.layouts)}"
                )
            return rule(self, node)
        except NotShardable as e:
            raise self.refuse(node, str(e)) from None

    def _reduce_partial_inputs(self, node: fx.Node) -> None:
        """All-reduce the partial sums ``node`` reads (it needs their full values)."""
        for a in node.all_input_nodes:
            if self.layout(a) is not PARTIAL:
                continue
            found = self._reduced.get(a)
            if found is None:
                found = self._reduced[a] = Reduction(a, "sum", 1.0, [node])
                self.reductions.append(found)
            elif node not in found.users:
                found.users.append(node)

    def _output(self, node: fx.Node) -> None:
        for value in node.all_input_nodes:
            lay = self.layouts.get(value)
            if lay is None:
                continue
            if not isinstance(lay, Shard) or lay.outer != 1 or lay.parts:
                raise NotShardable(f"the graph returns '{value.name}', cut along {lay!r}")
            self.gathers.append((value, lay))
        return None

    def _site(self, site: Site) -> Any:
        w = self.weights.get(site.weight)
        inp = self.layout(site.input)
        name = site.node.name
        if site.kind == "embedding":
            if inp is not None:
                raise NotShardable(f"embedding '{name}' looks up sharded token ids")
            if w is None:
                return None
            if w.dim != 0 or w.parts:
                raise NotShardable(f"embedding '{name}' can only be cut along its rows (dim 0)")
            self.embeddings.append(site)
            return None
        if site.kind == "batched":
            return self._batched(site, w, inp)
        in_rank = len(self.shape(site.input))
        out_dim = len(self.shape(site.node)) - 1
        if w is not None and w.dim == site.out_dim:
            if inp is not None:
                raise NotShardable(
                    f"column-parallel '{name}' reads '{site.input.name}', which is already sharded"
                )
            return Shard(out_dim, parts=w.parts, ways=w.ways)
        features = isinstance(inp, Shard) and inp.dim == in_rank - 1
        if w is not None:  # row-parallel
            if (
                w.dim != site.in_dim
                or not features
                or inp.outer != 1
                or (inp.parts, inp.ways) != (w.parts, w.ways)
            ):
                got = inp.describe() if isinstance(inp, Shard) else "replicated"
                raise NotShardable(
                    f"row-parallel '{name}' needs its input cut along its features, got {got}"
                )
            return self._row_output(site)
        if inp is None:
            return None
        if features:
            if self.discover and inp.outer == 1:
                self.weights[site.weight] = Shard(site.in_dim, parts=inp.parts, ways=inp.ways)
                self.rows.append(site)
                return self._row_output(site)
            raise NotShardable(
                f"'{name}' reads '{site.input.name}' cut along its features, but its weight "
                f"'{site.weight.name}' is not row-parallel"
            )
        if site.kind == "grouped":
            raise NotShardable(f"grouped matmul '{name}' reads rows cut along {inp.describe()}")
        return inp  # cut along tokens: a linear keeps its leading dims

    def _batched(self, site: Site, w: Shard | None, inp: Any) -> Any:
        """A batched matmul over a stack of experts: cut by expert (dim 0 of the stack and
        of the batch); a replicated batch is sliced to this rank's experts locally."""
        name = site.node.name
        whole = Shard(0)
        if w is None:
            if inp is None:
                return None
            if inp != whole or not self.discover:
                got = inp.describe() if isinstance(inp, Shard) else repr(inp)
                raise NotShardable(f"batched matmul '{name}' reads its batch cut along {got}")
            self.weights[site.weight] = whole
            self.batched.append(site)
            return whole
        if w != whole:
            raise NotShardable(f"batched matmul '{name}' can only cut its stack by expert")
        if inp is None:
            self.local_slices.append((site.node, site.input, whole))
        elif inp != whole:
            raise NotShardable(
                f"batched matmul '{name}' reads its batch cut along {inp.describe()}"
            )
        return whole

    def _row_output(self, site: Site) -> Any:
        if site.kind == "grouped":  # the experts' partial sums go on to where they combine
            return PARTIAL
        self.partial.append(site)
        return None
