"""torch.fx's subgraph rewriter, with torch's signatures and results, on fxpass.

``replace_pattern`` and ``replace_pattern_with_filters`` behave as torch's do (same
matches in the same order, same replacement nodes and names, same errors), but:

* matching is linear in the graph (see :mod:`fxpass.compat._subgraph`);
* new nodes get ``meta['val']`` (fake values propagated through the replacement),
  ``stack_trace``, ``nn_module_stack`` and provenance (``from_node``, ``fxpass_provenance``);
* inside an fxpass pipeline every replacement asks the debug counter first and is reported
  to the instrumentation;
* a tensor constant of a replacement written as a function (``torch.tensor(2.0)`` in it)
  is copied into the module under a name of its own: torch's copy reads whatever attribute
  of the module has the traced name (``_tensor_constant0``: the module's own constant, or
  nothing), so its rewritten graph computes with the wrong tensor or fails when run;
* ``ignore_literals=True`` does not crash: a literal in the pattern matches any argument,
  but an op in the pattern never "matches" a literal (torch's matcher lets it, then fails
  with ``KeyError``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx
from torch.fx import Graph, GraphModule, Node
from torch.fx.subgraph_rewriter import Match
from torch.fx.subgraph_rewriter import ReplacedPatterns as _TorchReplacedPatterns

from ..core.context import current_context
from ..fxutil.fx_internals import nodes_between, sort_key
from ..fxutil.paths import find_path
from ..rewrite.order import TopoOrder, users_before
from ..rewrite.rewriter import Rewriter, constant_node
from ._subgraph import InternalMatch, SubgraphMatcher

__all__ = ["Match", "ReplacedPatterns", "replace_pattern", "replace_pattern_with_filters"]


@dataclass
class ReplacedPatterns(_TorchReplacedPatterns):
    """torch's ``ReplacedPatterns`` (``anchor``, ``nodes_map``, ``replacements``)."""


# ----- the rewriter -------------------------------------------------------------------------
def replace_pattern(
    gm: GraphModule,
    pattern: Callable[..., Any] | GraphModule,
    replacement: Callable[..., Any] | GraphModule,
) -> list[Match]:
    """torch's ``replace_pattern``: replace every non-overlapping match of ``pattern`` in
    ``gm`` by ``replacement``; returns ``Match(anchor, nodes_map)`` per replacement."""
    done = _replace_pattern(gm, pattern, replacement)
    return [Match(anchor=m.anchor, nodes_map=m.nodes_map) for m in done]


def replace_pattern_with_filters(
    gm: GraphModule,
    pattern: Callable[..., Any] | Graph | GraphModule,
    replacement: Callable[..., Any] | Graph | GraphModule | None = None,
    match_filters: list[Callable[[InternalMatch, Graph, Graph], bool]] | None = None,
    ignore_literals: bool = False,
    replacement_callback: Callable[[InternalMatch, Graph, Graph], Graph] | None = None,
    node_name_match: str = "",
) -> list[ReplacedPatterns]:
    """torch's ``replace_pattern_with_filters`` (``match_filters``, ``ignore_literals``,
    ``replacement_callback``, ``node_name_match``); returns ``ReplacedPatterns``."""
    return _replace_pattern(
        gm,
        pattern,
        replacement,
        match_filters,
        ignore_literals,
        replacement_callback,
        node_name_match,
    )


def _graph_of(obj: Any) -> Graph:
    if isinstance(obj, GraphModule):
        return obj.graph
    if isinstance(obj, Graph):
        return obj
    return fx.symbolic_trace(obj).graph


def _replace_pattern(
    gm: GraphModule,
    pattern: Any,
    replacement: Any = None,
    match_filters: list[Callable[..., bool]] | None = None,
    ignore_literals: bool = False,
    replacement_callback: Callable[..., Graph] | None = None,
    node_name_match: str = "",
) -> list[ReplacedPatterns]:
    match_filters = match_filters or []
    original_graph: Graph = gm.graph
    pattern_graph = _graph_of(pattern)
    matcher = SubgraphMatcher(
        pattern_graph,
        match_output=False,
        match_placeholder=False,
        remove_overlapping_matches=True,
        ignore_literals=ignore_literals,
    )
    matches = matcher.match(original_graph, node_name_match=node_name_match)
    matches = [
        m for m in matches if all(f(m, original_graph, pattern_graph) for f in match_filters)
    ]
    if isinstance(replacement, (GraphModule, Graph)) or callable(replacement):
        common = _graph_of(replacement)
    elif replacement_callback is None:
        raise AssertionError(
            "Must provide either a replacement GraphModule or a replacement callback"
        )
    else:
        common = None
    surgeon = _Surgeon(
        gm,
        pattern_graph,
        own_constants=common is not None and not isinstance(replacement, (GraphModule, Graph)),
    )
    done: list[ReplacedPatterns] = []
    for m in matches:
        if replacement_callback is not None:
            graph = replacement_callback(m, original_graph, pattern_graph)
        else:
            graph = common
        if graph is None:
            raise AssertionError(
                "Must provide either a replacement GraphModule or a replacement callback"
            )
        result = surgeon.replace(m, graph)
        if result is not None:
            done.append(result)
    gm.recompile()
    if isinstance(replacement, torch.nn.Module):
        _replace_attributes(gm, replacement)
    return done


class _Surgeon:
    """torch's replacement steps for each match, through fxpass's rewriter."""

    def __init__(self, gm: GraphModule, pattern_graph: Graph, own_constants: bool) -> None:
        self.gm = gm
        #: the replacement is a function fxpass traced: its ``get_attr`` tensors are its own
        self.own_constants = own_constants
        self.graph = gm.graph
        self.pattern_nodes = [
            n for n in reversed(pattern_graph.nodes) if n.op not in ("placeholder", "output")
        ]
        self.changed: dict[Node, Node] = {}
        ctx = current_context()
        in_pass = ctx.pass_path[-1] if ctx is not None and ctx.pass_path else None
        self.rw = Rewriter(gm, pass_name=in_pass or "replace_pattern")

    def replace(self, match: InternalMatch, replacement: Graph) -> ReplacedPatterns | None:
        editor = self.rw.editor
        if not editor.allow():
            return None
        old = [match.nodes_map[n] for n in self.pattern_nodes]
        # torch's steps, one change: the run is told once, with the nodes made
        with editor.change("replace", "replace_pattern", old, location="") as change:
            return self._replace(match, replacement, change)

    def _replace(self, match: InternalMatch, replacement: Graph, change: Any) -> ReplacedPatterns:
        editor = self.rw.editor
        placeholders = [n for n in replacement.nodes if n.op == "placeholder"]
        if len(match.placeholder_nodes) != len(placeholders):
            raise AssertionError(
                f"Placeholder count mismatch: {len(match.placeholder_nodes)} vs {len(placeholders)}"
            )
        val_map = self._inputs(match, placeholders)
        insert_at, movers = self._insert_point(match, val_map, set(change.old))
        before = insert_at.prev
        with self.graph.inserting_before(insert_at):
            returned = self._copy(replacement, val_map)
        if isinstance(returned, Node):
            returned = (returned,)
        new = nodes_between(before, insert_at)
        replacements = [v for v in val_map.values() if v not in match.placeholder_nodes]
        if len(match.returning_nodes) != len(returned):
            raise AssertionError(
                f"Returning nodes count mismatch: {len(match.returning_nodes)} vs {len(returned)}"
            )
        donors = {c: g for g, c in zip(match.returning_nodes, returned) if isinstance(c, Node)}
        self._metadata(match, new, donors)
        for gn, copied in zip(match.returning_nodes, returned):
            editor.replace_all_uses(gn, copied, "replace_pattern", erase_old=False)
            self.changed[gn] = copied
        prev = insert_at.prev
        for m in movers:  # readers of an output placed before the replacement follow it
            editor.move(m, after=prev, rule="replace_pattern")
            prev = m
        for gn in change.old:
            if gn.users:
                editor.erase(gn, "replace_pattern")  # raises as torch does: still used
            else:
                editor.erase_all([gn], "replace_pattern")
        change.new = new
        return ReplacedPatterns(
            anchor=match.anchors[0], nodes_map=match.nodes_map, replacements=replacements
        )

    def _inputs(self, match: InternalMatch, placeholders: list[Node]) -> dict[Node, Any]:
        val_map: dict[Node, Any] = {}
        for rn, gn in zip(placeholders, match.placeholder_nodes):
            if isinstance(gn, Node):
                val_map[rn] = self.changed.get(gn, gn)
                if gn != val_map[rn]:  # a match input replaced by an earlier match
                    i = match.placeholder_nodes.index(gn)
                    match.placeholder_nodes[i] = self.changed[gn]
                    key = list(match.nodes_map.keys())[list(match.nodes_map.values()).index(gn)]
                    match.nodes_map[key] = self.changed[gn]
            else:
                val_map[rn] = gn
        return val_map

    def _insert_point(
        self, match: InternalMatch, val_map: dict[Node, Any], region: set[Node]
    ) -> tuple[Node, list[Node]]:
        """Where the replacement goes (torch's place: before the first user of an output),
        and the nodes to move behind it. torch's place may come before an input of the
        replacement (two unconnected pieces in one pattern, the later one's input made
        between them): torch then writes a graph that reads a value before making it.
        Here the replacement goes after its last input, and the readers of the outputs
        placed before that follow it."""
        users: set[Node] = set()
        for n in match.returning_nodes:
            users.update(n.users)
        if users:
            at = min(users, key=sort_key)
        else:
            at = max(match.returning_nodes, key=sort_key).next
        inputs = [v for v in val_map.values() if isinstance(v, Node)]
        if not inputs:
            return at, []
        last = max(inputs, key=sort_key)
        if sort_key(at) > sort_key(last):
            return at, []
        after = last.next
        movers = users_before(TopoOrder(self.graph), match.returning_nodes, region, sort_key(after))
        if set(movers) & set(inputs):  # an input reads an output: no order works
            return at, []
        return after, movers

    def _copy(self, replacement: Graph, val_map: dict[Node, Any]) -> Any:
        graph = self.graph
        for node in replacement.nodes:
            if node in val_map:
                continue
            if node.op == "output":
                return fx.map_arg(node.args[0], lambda n: val_map[n])
            value = self._constant(node)
            if value is not None:
                val_map[node] = constant_node(graph, value, self.rw.editor)
                continue
            args = fx.map_arg(node.args, lambda n: val_map[n])
            kwargs = fx.map_arg(node.kwargs, lambda n: val_map[n])
            copied = self.rw.editor.create(
                graph, node.op, node.target, args, kwargs, name=node.name, type_expr=node.type
            )
            copied.meta = copy.copy(node.meta)
            val_map[node] = copied
        return None

    def _constant(self, node: Node) -> torch.Tensor | None:
        """The tensor a ``get_attr`` of a traced replacement function reads, else None."""
        owner = node.graph.owning_module
        if not self.own_constants or node.op != "get_attr" or owner is None:
            return None
        value = find_path(owner, str(node.target))
        return value if isinstance(value, torch.Tensor) else None

    def _metadata(self, match: InternalMatch, new: list[Node], donors: dict[Node, Node]) -> None:
        if not new:
            return
        replaced = [match.nodes_map[n] for n in reversed(self.pattern_nodes)]
        root = match.returning_nodes[0] if match.returning_nodes else replaced[-1]
        for n in new:
            for key in ("val", "tensor_meta", "example_value"):
                n.meta.pop(key, None)
        meta = self.rw.meta
        meta.values(new, donors, root)
        meta.provenance(
            new,
            donors,
            root,
            replaced,
            outputs=list(match.returning_nodes),
            rule="replace_pattern",
            pass_name=self.rw.pass_name,
            location="",
        )


def _replace_attributes(gm: GraphModule, replacement: torch.nn.Module) -> None:
    """Copy attributes the replacement module's nodes use into ``gm`` (as torch does)."""
    gm.delete_all_unused_submodules()
    if isinstance(replacement, GraphModule):
        replacement.graph.lint()

    def try_get_attr(mod: torch.nn.Module, target: str) -> Any:
        path, _, attr = target.rpartition(".")
        try:
            sub = mod.get_submodule(path)
        except AttributeError:
            return None
        return getattr(sub, attr, None)

    for node in gm.graph.nodes:
        if node.op in ("call_module", "get_attr"):
            if try_get_attr(gm, node.target) is not None:
                continue
            value = try_get_attr(replacement, node.target)
            if value is None:
                raise RuntimeError(
                    'Attempted to create a "',
                    node.op,
                    '" node during subgraph rewriting '
                    f"with target {node.target}, but "
                    "the referenced attribute does not "
                    "exist in the replacement GraphModule",
                )
            new_attr = copy.deepcopy(value)
            if isinstance(value, torch.nn.Module):
                gm.add_submodule(node.target, new_attr)
            else:
                setattr(gm, node.target, new_attr)
    gm.graph.lint()
