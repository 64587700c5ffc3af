"""torch.fx's subgraph rewriter and matchers, with torch's signatures and results, on fxpass.

``replace_pattern``, ``replace_pattern_with_filters``, ``SubgraphMatcher`` and
``SubgraphMatcherWithNameNodeMap`` behave as torch's do (same matches in the same order,
same replacement nodes and names, same errors), but:

* matching is linear in the graph: candidates for the pattern's anchors come from the
  graph's op index, and the check that a match would not form a cycle only looks between
  the match and its last node (torch scans the whole graph per anchor, and again to the
  end of the graph per match);
* new nodes get ``meta['val']`` (fake values propagated through the replacement),
  ``stack_trace``, ``nn_module_stack`` and provenance (``from_node``, ``fxpass_provenance``);
* inside an fxpass pipeline every replacement asks the debug counter first and is reported
  to the instrumentation;
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
from torch.fx.passes.utils.matcher_utils import InternalMatch as _TorchInternalMatch
from torch.fx.subgraph_rewriter import Match
from torch.fx.subgraph_rewriter import ReplacedPatterns as _TorchReplacedPatterns

from ..core.context import ChangeEvent, current_context
from ..rewrite._state import MISSING, MatchState
from ..rewrite.order import TopoOrder, _sort_key, find_cycle
from ..rewrite.pattern import Lit, P, Pattern, Seq, Var, _Module, _show, mark_shared
from ..rewrite.rewriter import Rewriter, _between, new_node

__all__ = [
    "InternalMatch",
    "Match",
    "ReplacedPatterns",
    "SubgraphMatcher",
    "SubgraphMatcherWithNameNodeMap",
    "replace_pattern",
    "replace_pattern_with_filters",
]


@dataclass
class InternalMatch(_TorchInternalMatch):
    """torch's ``InternalMatch`` (``anchors``, ``nodes_map``, ``placeholder_nodes``,
    ``returning_nodes``, ``name_node_map``); an instance of torch's class too."""

    def __copy__(self) -> InternalMatch:
        return InternalMatch(
            anchors=self.anchors,
            nodes_map=self.nodes_map.copy(),
            placeholder_nodes=self.placeholder_nodes.copy(),
            returning_nodes=self.returning_nodes.copy(),
        )


@dataclass
class ReplacedPatterns(_TorchReplacedPatterns):
    """torch's ``ReplacedPatterns`` (``anchor``, ``nodes_map``, ``replacements``)."""


# ----- the pattern graph as fxpass patterns -----------------------------------------------
class _Kind(Pattern):
    """A placeholder or output node of the pattern matched as part of it."""

    __slots__ = ("args", "op")

    def __init__(self, op: str, args: Pattern | None, name: str) -> None:
        super().__init__(name, "")
        self.op = op
        self.args = args

    def children(self):
        return [self.args] if self.args is not None else []

    def _m(self, v, st, k):
        if not isinstance(v, Node) or (v.op != self.op and not _name_hit(v, st)):
            if st.explain:
                return st.miss(lambda: f"expected a {self.op} node, got {_show(v)}")
            return False
        if st.injective and v in st.used:
            return False
        if self._shared:
            hit = self._memo_hit(v, st, k)
            if hit is not None:
                return hit
        if st.injective:
            st.used[v] = self
        if self.args is None:
            ok = self._bind(v, st, k)
        else:
            args = list(v.args) + list(v.kwargs.values())
            ok = self.args._m(args, st, lambda: self._bind(v, st, k))
        if not ok and st.injective:
            del st.used[v]
        return ok


class _Attr(Pattern):
    """A ``get_attr`` node: matches a ``get_attr`` whose value has the same type (tensors)."""

    __slots__ = ("value",)

    def __init__(self, value: Any, name: str) -> None:
        super().__init__(name, "")
        self.value = value

    def _m(self, v, st, k):
        if not isinstance(v, Node) or (v.op != "get_attr" and not _name_hit(v, st)):
            return False
        if st.injective and v in st.used:
            return False
        if self._shared:
            hit = self._memo_hit(v, st, k)
            if hit is not None:
                return hit
        if v.op == "get_attr" and not self._same_kind(v):
            return False
        if st.injective:
            st.used[v] = self
        ok = self._bind(v, st, k)
        if not ok and st.injective:
            del st.used[v]
        return ok

    def _same_kind(self, v: Node) -> bool:
        owner = v.graph.owning_module
        if owner is None:
            raise AssertionError("gn.graph.owning_module must not be None")
        value = fx.graph_module._get_attr(owner, v.target)
        if type(self.value) is not type(value):
            return False
        if isinstance(self.value, torch.Tensor):
            return isinstance(value, torch.Tensor)
        raise RuntimeError(f"Unsupported type {self.value} when matching attributes")


def _name_hit(v: Node, st: MatchState) -> bool:
    return bool(st.name_match) and st.name_match in v.name


class _Wild(Var):
    """A placeholder used as a wildcard (with ``node_name_match`` it still matches all)."""


def _convert(pattern: Graph, match_placeholder: bool, match_output: bool) -> dict[Node, Pattern]:
    """Each pattern node as an fxpass pattern named after it (torch's matching rules)."""
    pats: dict[Node, Pattern] = {}

    def arg(a: Any) -> Any:
        if isinstance(a, Node):
            return pats[a]
        if isinstance(a, (list, tuple)):
            if any(isinstance(x, (Node, list, tuple)) for x in a):
                return Seq([arg(x) for x in a])
            return Lit(a)
        return Lit(a)

    for n in pattern.nodes:
        if n.op == "placeholder":
            pats[n] = (
                _Kind("placeholder", None, n.name)
                if match_placeholder
                else _Wild(n.name, location="")
            )
        elif n.op == "get_attr":
            owner = pattern.owning_module
            if owner is None:
                raise AssertionError("pn.graph.owning_module must not be None")
            pats[n] = _Attr(fx.graph_module._get_attr(owner, n.target), n.name)
        elif n.op == "output":
            if match_output:
                everything = [arg(a) for a in n.args] + [arg(a) for a in n.kwargs.values()]
                pats[n] = _Kind("output", Seq(everything), n.name)
        else:
            target = _Module(n.target) if n.op == "call_module" else n.target
            args = [arg(a) for a in n.args]
            p = P.exact(target, *args, **{k: arg(v) for k, v in n.kwargs.items()})
            p.name = n.name
            p.location = ""
            pats[n] = p
    return pats


# ----- the matcher ------------------------------------------------------------------------
class SubgraphMatcher:
    """torch's ``SubgraphMatcher`` on fxpass's matcher (same arguments, same results)."""

    def __init__(
        self,
        pattern: Graph,
        match_output: bool = False,
        match_placeholder: bool = False,
        remove_overlapping_matches: bool = True,
        ignore_literals: bool = False,
    ) -> None:
        self.pattern = pattern
        self.match_output = match_output
        self.match_placeholder = match_placeholder
        self.remove_overlapping_matches = remove_overlapping_matches
        self.ignore_literals = ignore_literals
        if len(pattern.nodes) == 0:
            raise ValueError("SubgraphMatcher cannot be initialized with an empty pattern")
        for node in pattern.nodes:
            if node.op != "output" and not node.is_impure() and len(node.users) == 0:
                raise AssertionError(
                    "SubgraphMatcher cannot be initialized with an pattern with dead code"
                )
        self.pattern_placeholder_nodes = [n for n in pattern.nodes if n.op == "placeholder"]
        output_node = next(iter(reversed(pattern.nodes)))
        self.pattern_returning_nodes: list[Node] = output_node.all_input_nodes
        if match_output:
            self.pattern_anchors = [output_node]
        else:
            self.pattern_anchors = [n for n in output_node.all_input_nodes if len(n.users) == 1]
        self._pats = _convert(pattern, match_placeholder, match_output)
        mark_shared([self._pats[a] for a in self.pattern_anchors if a in self._pats])
        self._order = [n for n in _preorder(self.pattern_anchors) if n in self._pats]

    # ----- candidates -------------------------------------------------------------------
    def _candidates(self, anchor: Node, graph: Graph, name_match: str) -> list[Node]:
        if name_match or (anchor.op == "placeholder" and not self.match_placeholder):
            return [n for n in graph.nodes if self._could_be(anchor, n, name_match)]
        if anchor.op == "call_function":
            return list(graph.find_nodes(op="call_function", target=anchor.target))
        if anchor.op in ("call_method", "call_module"):
            nodes = graph.find_nodes(op=anchor.op)
            return [n for n in nodes if n.target == anchor.target]
        return list(graph.find_nodes(op=anchor.op))

    def _could_be(self, pn: Node, gn: Node, name_match: str) -> bool:
        if not self.match_placeholder and pn.op == "placeholder":
            return True
        if name_match and name_match in gn.name:
            return True
        if pn.op != gn.op:
            return False
        if pn.op in ("placeholder", "output", "get_attr"):
            return True
        return pn.target == gn.target

    # ----- matching ---------------------------------------------------------------------
    def match(self, graph: Graph, node_name_match: str = "") -> list[InternalMatch]:
        """Every match of the pattern in ``graph`` (torch's order, filters and overlaps)."""
        anchors = self.pattern_anchors
        cands = [self._candidates(a, graph, node_name_match) for a in anchors]
        st = MatchState(
            injective=True,
            exact_literals=True,
            ignore_literals=self.ignore_literals,
            name_match=node_name_match,
        )
        found: list[InternalMatch] = []
        pats = [self._pats[a] for a in anchors]

        def step(i: int) -> bool:
            if i == len(anchors):
                found.append(self._record(st))
                return False  # keep enumerating, as torch's backtracking does
            for c in cands[i]:
                pats[i]._m(c, st, lambda: step(i + 1))
            return False

        if anchors and all(cands):
            step(0)
        order = TopoOrder(graph)
        valid = [m for m in found if self._is_contained(m.nodes_map) and _acyclic(m, order)]
        if self.remove_overlapping_matches:
            valid = _remove_overlapping(valid)
        return valid

    def _record(self, st: MatchState) -> InternalMatch:
        env = st.env
        nodes_map = {}
        for pn in self._order:
            value = env.get(pn.name, MISSING)
            if value is not MISSING:
                nodes_map[pn] = value
        m = InternalMatch(anchors=self.pattern_anchors, nodes_map=nodes_map)
        m.placeholder_nodes = [nodes_map[pn] for pn in self.pattern_placeholder_nodes]
        m.returning_nodes = [nodes_map[pn] for pn in self.pattern_returning_nodes]
        return m

    def _is_contained(self, nodes_map: dict[Node, Node]) -> bool:
        lookup = {gn: pn for pn, gn in nodes_map.items() if pn.op != "placeholder"}
        returning = self.pattern_returning_nodes
        for gn, pn in lookup.items():
            if pn in returning:
                continue
            for user in gn.users:
                if user not in lookup:
                    return False
        return True


def _preorder(anchors: list[Node]) -> list[Node]:
    """Pattern nodes in the order torch's matcher first visits them (pre-order, args first
    to last), so ``nodes_map`` iterates as torch's does."""
    out: dict[Node, None] = {}
    stack: list[Any] = list(reversed(anchors))
    while stack:
        n = stack.pop()
        if isinstance(n, Node):
            if n in out:
                continue
            out[n] = None
            stack.extend(reversed([*n.args, *n.kwargs.values()]))
        elif isinstance(n, (list, tuple)):
            stack.extend(reversed(n))
    return list(out)


def _acyclic(m: InternalMatch, order: TopoOrder) -> bool:
    region = {gn for pn, gn in m.nodes_map.items() if pn.op not in ("placeholder", "output")}
    region = {n for n in region if isinstance(n, Node)}
    return not region or find_cycle(order, region) is None


def _remove_overlapping(matches: list[InternalMatch]) -> list[InternalMatch]:
    kept: list[InternalMatch] = []
    used: set[Node] = set()
    for m in matches:
        inner = [gn for pn, gn in m.nodes_map.items() if pn.op not in ("placeholder", "output")]
        if any(gn in used for gn in inner):
            continue
        kept.append(m)
        used.update(inner)
    return kept


# ----- name-node maps ---------------------------------------------------------------------
def _split_to_graph_and_name_node_map(gm: GraphModule) -> tuple[GraphModule, dict[str, Node]]:
    from torch.fx.graph import _PyTreeInfo
    from torch.utils._pytree import tree_flatten, tree_unflatten

    name_node_map: dict[str, Node] = {}
    for n in gm.graph.nodes:
        if n.op == "output":
            if gm._out_spec is None:
                raise AssertionError("gm._out_spec is None")
            output = tree_unflatten(n.args[0], gm._out_spec)
            if not isinstance(output, tuple):
                raise AssertionError("Expecting the pattern graph to return a tuple")
            if len(output) < 2:
                raise AssertionError("Expecting the pattern graph to have at least two outputs")
            *out, name_node_map = output
            flattened, out_spec = tree_flatten(out)
            if not isinstance(name_node_map, dict):
                raise AssertionError(
                    "Expecting the input graph to have a dict output as the last element"
                )
            n.args = (flattened,)
            info = gm._graph._codegen.pytree_info  # type: ignore[attr-defined]
            gm._graph._codegen.pytree_info = _PyTreeInfo(  # type: ignore[attr-defined]
                info.orig_args, info.in_spec, out_spec
            )
    gm.recompile()
    return gm, name_node_map


class SubgraphMatcherWithNameNodeMap(SubgraphMatcher):
    """torch's ``SubgraphMatcherWithNameNodeMap``: the pattern returns, last, a dict of
    names to its nodes; each match's ``name_node_map`` maps those names to graph nodes."""

    def __init__(
        self,
        pattern_gm: GraphModule,
        match_output: bool = False,
        match_placeholder: bool = False,
        remove_overlapping_matches: bool = True,
        ignore_literals: bool = False,
    ) -> None:
        pattern_gm, name_node_map = _split_to_graph_and_name_node_map(pattern_gm)
        self.name_node_map = name_node_map
        super().__init__(
            pattern_gm.graph,
            match_output,
            match_placeholder,
            remove_overlapping_matches,
            ignore_literals,
        )

    def match(self, graph: Graph, node_name_match: str = "") -> list[InternalMatch]:
        matches = super().match(graph, node_name_match)
        for m in matches:
            for k, n in self.name_node_map.items():
                m.name_node_map[k] = m.nodes_map[n]
        return matches


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
    surgeon = _Surgeon(gm, pattern_graph)
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

    def __init__(self, gm: GraphModule, pattern_graph: Graph) -> None:
        self.gm = gm
        self.graph = gm.graph
        self.pattern_nodes = [
            n for n in reversed(pattern_graph.nodes) if n.op not in ("placeholder", "output")
        ]
        self.changed: dict[Node, Node] = {}
        ctx = current_context()
        in_pass = ctx.pass_path[-1] if ctx is not None and ctx.pass_path else None
        self.rw = Rewriter(gm, pass_name=in_pass or "replace_pattern")

    def replace(self, match: InternalMatch, replacement: Graph) -> ReplacedPatterns | None:
        ctx = self.rw.ctx
        if ctx is not None and not ctx.allow():
            return None
        placeholders = [n for n in replacement.nodes if n.op == "placeholder"]
        if len(match.placeholder_nodes) != len(placeholders):
            raise AssertionError(
                f"Placeholder count mismatch: {len(match.placeholder_nodes)} vs {len(placeholders)}"
            )
        val_map = self._inputs(match, placeholders)
        insert_at = self._insert_point(match)
        before = insert_at.prev
        with self.graph.inserting_before(insert_at):
            returned = self._copy(replacement, val_map)
        if isinstance(returned, Node):
            returned = (returned,)
        new = _between(before, insert_at)
        replacements = [v for v in val_map.values() if v not in match.placeholder_nodes]
        if len(match.returning_nodes) != len(returned):
            raise AssertionError(
                f"Returning nodes count mismatch: {len(match.returning_nodes)} vs {len(returned)}"
            )
        donors = {c: g for g, c in zip(match.returning_nodes, returned) if isinstance(c, Node)}
        self._metadata(match, new, donors)
        for gn, copied in zip(match.returning_nodes, returned):
            gn.replace_all_uses_with(copied)
            self.changed[gn] = copied
        old = [match.nodes_map[n] for n in self.pattern_nodes]
        erase = self.rw.fast_erase
        for gn in old:
            if gn.users or erase is None:
                self.graph.erase_node(gn)  # raises as torch does if still used
            else:
                erase(gn)
        if ctx is not None:
            ctx.notify(ChangeEvent("replace", "replace_pattern", old, new, 0, ""))
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

    def _insert_point(self, match: InternalMatch) -> Node:
        users: set[Node] = set()
        for n in match.returning_nodes:
            users.update(n.users)
        if users:
            return min(users, key=_sort_key)
        last = max(match.returning_nodes, key=_sort_key)
        return last.next

    def _copy(self, replacement: Graph, val_map: dict[Node, Any]) -> Any:
        graph = self.graph
        for node in replacement.nodes:
            if node in val_map:
                continue
            if node.op == "output":
                return fx.map_arg(node.args[0], lambda n: val_map[n])
            args = fx.map_arg(node.args, lambda n: val_map[n])
            kwargs = fx.map_arg(node.kwargs, lambda n: val_map[n])
            copied = new_node(graph, node.op, node.target, args, kwargs, node.name, node.type)
            copied.meta = copy.copy(node.meta)
            val_map[node] = copied
        return None

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
