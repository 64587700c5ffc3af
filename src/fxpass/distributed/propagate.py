"""Follow sharded weights through a graph: which values end up sharded, where partial sums
must be all-reduced, which constants change, and what the world size must divide.

Given the layout of some weights (column-parallel: cut along dim 0; row-parallel: dim 1;
vocab-parallel embeddings: dim 0), :class:`Flow` walks forward from the sites that read
them, in graph order, visiting only values that are sharded. Each op goes through its rule
(:mod:`fxpass.distributed.rules`); a row-parallel site turns its sharded input into partial
sums, which are all-reduced right there, so its users see a replicated value again. A
sharded value the graph returns is all-gathered. An op that cannot take a slice stops the
walk with :class:`Refused`, naming the node, the reason and the column sites it came from.

The analysis runs a flow per group of candidate sites (``discover=True`` lets it find the
row-parallel sites that close them); the rewrite runs one flow with the whole plan and
applies what it recorded.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx

from .layout import PARTIAL, NotShardable, Shard
from .rules import rule_for
from .sites import Site, target_of

__all__ = ["Flow", "Refused", "Requirement"]


class Refused(Exception):
    """The walk met an op that cannot take a slice; ``sources`` are the column sites whose
    values reached it."""

    def __init__(self, node: fx.Node, reason: str, sources: frozenset[Site]) -> None:
        super().__init__(reason)
        self.node = node
        self.sources = sources


@dataclass
class Requirement:
    """The world size must divide ``units`` (heads, features, rows) for ``what``."""

    node: fx.Node
    units: int
    what: str
    sources: frozenset[Site]


@dataclass
class Flow:
    """One propagation of weight layouts through ``gm`` (see the module docstring)."""

    gm: fx.GraphModule
    sites: Mapping[fx.Node, Site]
    weights: dict[fx.Node, Shard]
    world_size: int
    discover: bool = False
    order: Mapping[fx.Node, int] | None = None
    layouts: dict[fx.Node, Any] = field(default_factory=dict)
    sources: dict[fx.Node, frozenset[Site]] = field(default_factory=dict)
    partial: list[Site] = field(default_factory=list)
    embeddings: list[Site] = field(default_factory=list)
    rows: list[Site] = field(default_factory=list)
    gathers: list[tuple[fx.Node, Shard]] = field(default_factory=list)
    edits: list[tuple[fx.Node, tuple[str, Any], Any]] = field(default_factory=list)
    requirements: list[Requirement] = field(default_factory=list)
    _current: fx.Node | None = None

    # ----- what rules use ------------------------------------------------------------------
    def layout(self, arg: Any) -> Any:
        return self.layouts.get(arg) if isinstance(arg, fx.Node) else None

    def shape(self, node: fx.Node) -> tuple[int, ...]:
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            raise NotShardable(f"'{node.name}' has no tensor value (meta['val'])")
        return tuple(int(s) for s in val.shape)

    def op(self, node: fx.Node) -> Any:
        return target_of(node)

    def edit(self, node: fx.Node, where: tuple[str, Any], value: Any) -> None:
        self.edits.append((node, where, value))

    def require(self, node: fx.Node, units: int, what: str) -> None:
        srcs = self.sources.get(self._current, frozenset()) if self._current else frozenset()
        self.requirements.append(Requirement(node, units, what, srcs))

    # ----- the walk -----------------------------------------------------------------------------
    def run(self, seeds: Iterable[fx.Node] | None = None) -> Flow:
        """Walk from ``seeds`` (default: every site whose weight has a layout)."""
        order = self.order or {n: i for i, n in enumerate(self.gm.graph.nodes)}
        self.order = order
        if seeds is None:
            seeds = [s.node for s in self.sites.values() if s.weight in self.weights]
        heap = [(order[n], n.name, n) for n in set(seeds)]
        heapq.heapify(heap)
        seen = {n for _, _, n in heap}
        while heap:
            _, _, node = heapq.heappop(heap)
            self._current = node
            self.sources[node] = self._sources_of(node)
            layout = self._visit(node)
            if layout is None:
                continue
            self.layouts[node] = layout
            for user in node.users:
                if user not in seen:
                    seen.add(user)
                    heapq.heappush(heap, (order[user], user.name, user))
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
                return self._site(site)
            if node.op == "output":
                return self._output(node)
            if node.op != "call_function":
                raise NotShardable(f"'{node.name}' ({node.op}) reads a sharded value")
            for a in node.all_input_nodes:
                if self.layouts.get(a) is PARTIAL:
                    raise NotShardable(f"'{node.name}' reads partial sums of '{a.name}'")
            rule = rule_for(self.op(node))
            if rule is None:
                raise NotShardable(
                    f"'{node.name}' ({self.op(node)}) cannot take a slice of "
                    f"{', '.join(repr(a.name) for a in node.all_input_nodes if a in self.layouts)}"
                )
            return rule(self, node)
        except NotShardable as e:
            raise self.refuse(node, str(e)) from None

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
        in_rank = len(self.shape(site.input))
        if w is not None and w.dim == 0:
            if inp is not None:
                raise NotShardable(
                    f"column-parallel '{name}' reads '{site.input.name}', which is already sharded"
                )
            return Shard(len(self.shape(site.node)) - 1, parts=w.parts)
        features = isinstance(inp, Shard) and inp.dim == in_rank - 1
        if w is not None:  # row-parallel
            if not features or inp.outer != 1 or inp.parts != w.parts:
                got = inp.describe() if isinstance(inp, Shard) else "replicated"
                raise NotShardable(
                    f"row-parallel '{name}' needs its input cut along its features, got {got}"
                )
            self.partial.append(site)
            return None
        if inp is None:
            return None
        if features:
            if self.discover and inp.outer == 1:
                self.weights[site.weight] = Shard(1, parts=inp.parts)
                self.rows.append(site)
                self.partial.append(site)
                return None
            raise NotShardable(
                f"'{name}' reads '{site.input.name}' cut along its features, but its weight "
                f"'{site.weight.name}' is not row-parallel"
            )
        return inp  # cut along tokens: a linear keeps its leading dims
