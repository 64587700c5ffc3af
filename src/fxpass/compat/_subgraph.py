"""torch.fx's subgraph matchers, with torch's signatures and results, on fxpass.

``SubgraphMatcher`` and ``SubgraphMatcherWithNameNodeMap`` behave as torch's do (same
matches in the same order, same errors), but matching is linear in the graph: candidates
for the pattern's anchors come from the graph's op index, and the check that a match would
not form a cycle only looks between the match and its last node (torch scans the whole
graph per anchor, and again to the end of the graph per match). The pattern graph becomes
fxpass patterns matched by :class:`~fxpass.rewrite.torchlike.TorchMatching` (torch's
rules); :mod:`fxpass.compat._replace` rewrites what they find.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import fx
from torch.fx import Graph, GraphModule, Node
from torch.fx.passes.utils.matcher_utils import InternalMatch as _TorchInternalMatch

from ..edit.editor import Editor
from ..fxutil.fx_internals import out_spec_of, pytree_info, set_pytree_info
from ..rewrite.interpreted import Cont
from ..rewrite.leaves import Lit, Pattern, Seq, Var, mark_shared
from ..rewrite.match import MISSING, MatchState
from ..rewrite.order import TopoOrder, find_cycle
from ..rewrite.pattern import P
from ..rewrite.spelling import Module
from ..rewrite.torchlike import TorchMatching

__all__ = ["InternalMatch", "SubgraphMatcher", "SubgraphMatcherWithNameNodeMap"]


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


class _Attr(Pattern):
    """A ``get_attr`` node: matches a ``get_attr`` whose value has the same type (tensors)."""

    __slots__ = ("value",)

    def __init__(self, value: Any, name: str) -> None:
        super().__init__(name, "")
        self.value = value

    def same_kind(self, v: Node) -> bool:
        owner = v.graph.owning_module
        if owner is None:
            raise AssertionError("gn.graph.owning_module must not be None")
        value = fx.graph_module._get_attr(owner, v.target)
        if type(self.value) is not type(value):
            return False
        if isinstance(self.value, torch.Tensor):
            return isinstance(value, torch.Tensor)
        raise RuntimeError(f"Unsupported type {self.value} when matching attributes")


class _Rules(TorchMatching):
    """torch's matching rules, with the pattern graph's placeholders, outputs and
    attributes as patterns of their own."""

    HANDLERS = {**TorchMatching.HANDLERS, _Kind: "kind", _Attr: "attr"}

    def kind(self, p: _Kind, v: Any, st: MatchState, k: Cont) -> bool:
        if not isinstance(v, Node):
            return p.op == "placeholder" and self.literal(p, v, st, k)
        if v.op != p.op and not self.name_hit(p, v):
            return False
        if p.shared:  # a second use of the same pattern node: the node it matched
            hit = self.memo_hit(p, v, st, k)
            if hit is not None:
                return hit
        if v in st.used:
            return False
        st.used[v] = p
        if p.args is None:
            ok = self.bind(p, v, st, k)
        else:
            args = list(v.args) + list(v.kwargs.values())
            ok = self.match(p.args, args, st, lambda: self.bind(p, v, st, k))
        if not ok:
            del st.used[v]
        return ok

    def literal(self, p: _Kind, v: Any, st: MatchState, k: Cont) -> bool:
        """A placeholder facing a literal binds it, as torch's does even when placeholders
        must match placeholders; once bound it must see the same value, or with
        ``ignore_literals`` anything that is not a node."""
        prev = st.env.get(p.name, MISSING)
        if prev is MISSING:
            return self.bind(p, v, st, k)
        if self.ignore_literals:
            return k()
        try:
            same = not isinstance(prev, Node) and bool(prev == v)
        except (TypeError, RuntimeError):  # values that cannot be compared are not equal
            same = False
        return k() if same else False

    def attr(self, p: _Attr, v: Any, st: MatchState, k: Cont) -> bool:
        if not isinstance(v, Node) or (v.op != "get_attr" and not self.name_hit(p, v)):
            return False
        if p.shared:
            hit = self.memo_hit(p, v, st, k)
            if hit is not None:
                return hit
        if v in st.used:
            return False
        if v.op == "get_attr" and not p.same_kind(v):
            return False
        st.used[v] = p
        ok = self.bind(p, v, st, k)
        if not ok:
            del st.used[v]
        return ok


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
            target = Module(n.target) if n.op == "call_module" else n.target
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
        pattern = self._pattern_graph(pattern)
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

    def _pattern_graph(self, pattern: Any) -> Graph:
        """The pattern as a graph (the name-node-map matcher takes a GraphModule)."""
        return pattern

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
        rules = _Rules(
            injective=True,
            exact_literals=True,
            ignore_literals=self.ignore_literals,
            name_match=node_name_match,
            name_anchors=[self._pats[a] for a in anchors],
        )
        st = MatchState()
        found: list[InternalMatch] = []
        pats = [self._pats[a] for a in anchors]

        def step(i: int) -> bool:
            if i == len(anchors):
                found.append(self._record(st))
                return False  # keep enumerating, as torch's backtracking does
            for c in cands[i]:
                rules.match(pats[i], c, st, lambda: step(i + 1))
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
    from torch.utils._pytree import tree_flatten, tree_unflatten

    name_node_map: dict[str, Node] = {}
    for n in gm.graph.nodes:
        if n.op == "output":
            spec = out_spec_of(gm)
            if spec is None:
                raise AssertionError("the pattern graph has no output spec")
            output = tree_unflatten(n.args[0], spec)
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
            # the user's pattern graph, as torch edits it: no run watches it
            Editor(None).set_args(n, (flattened,), rule="name_node_map")
            info = pytree_info(gm.graph)
            set_pytree_info(gm.graph, info.orig_args, info.in_spec, out_spec)
    gm.recompile()
    return gm, name_node_map


class SubgraphMatcherWithNameNodeMap(SubgraphMatcher):
    """torch's ``SubgraphMatcherWithNameNodeMap`` (same arguments as ``SubgraphMatcher``,
    the pattern a GraphModule): the pattern returns, last, a dict of names to its nodes;
    each match's ``name_node_map`` maps those names to graph nodes."""

    def _pattern_graph(self, pattern_gm: Any) -> Graph:
        pattern_gm, self.name_node_map = _split_to_graph_and_name_node_map(pattern_gm)
        return pattern_gm.graph

    def match(self, graph: Graph, node_name_match: str = "") -> list[InternalMatch]:
        matches = super().match(graph, node_name_match)
        for m in matches:
            for k, n in self.name_node_map.items():
                m.name_node_map[k] = m.nodes_map[n]
        return matches
