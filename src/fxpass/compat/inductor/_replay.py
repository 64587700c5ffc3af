"""Putting a traced replacement in place of a match, through fxpass's rewriter.

A replacement graph is traced once (:mod:`._trace`); :class:`Replay` copies it into the
graph for each match: its placeholders take the match's values, its size symbols the
matched values' sizes — a number where they are static (folded into the arguments, so no
example size is ever baked in), a ``sym_size`` node where they are symbolic. The copy is
made by :class:`~fxpass.rewrite.Rewriter` (``apply``): it asks the debug counter, gives the
new nodes ``meta['val']`` and provenance, moves the uses of the matched outputs to the
replacement's, erases what nothing uses any more and tells the instrumentation.

As Inductor's ``replace_with_graph``: the outputs of the match (``match.output_nodes()``)
take the replacement's values in order; a match with one output whose users are
``getitem``\\ s may take a replacement returning several values (each ``getitem`` takes its
own); ``None`` outputs are skipped.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Sequence
from typing import Any

import torch
from torch import fx
from torch.fx import Node
from torch.fx.node import map_aggregate

from ...edit.editor import Editor
from ...fxutil.fx_internals import is_erased
from ...rewrite import GraphReplacement, Replace
from ...rewrite import Match as _FxMatch
from ...rewrite.rewriter import RewriteError, Rewriter
from ._trace import size_of

__all__ = ["Plan", "Replay", "apply_replay", "replace_with_graph", "replay_edit"]

#: Metadata Inductor's replacement nodes take from the traced replacement's nodes, and an
#: output from the node it replaces (fxpass's provenance handles the source location).
_META = ("original_aten", "recompute", "ac_graph_id", "custom", "partitioner_tag")
_SYM_VALUES = (torch.SymInt, torch.SymFloat, torch.SymBool)


class Plan:
    """What replaying a graph needs from it, read once: its placeholders, its other nodes
    (and which compute sizes), its output."""

    __slots__ = ("nodes", "out", "phs", "results", "sizes")

    def __init__(self, gm: fx.GraphModule) -> None:
        nodes = list(gm.graph.nodes)
        self.phs = [n for n in nodes if n.op == "placeholder"]
        self.nodes = [n for n in nodes if n.op not in ("placeholder", "output")]
        self.sizes = {n for n in self.nodes if isinstance(n.meta.get("val"), _SYM_VALUES)}
        self.out = next(n for n in reversed(nodes) if n.op == "output").args[0]
        self.results = len(self.out) if isinstance(self.out, (list, tuple)) else 1


class _SymRef:
    """A size symbol's placeholder during a replay: read from ``args[i]`` when used."""

    __slots__ = ("d", "i", "kind")

    def __init__(self, i: int, kind: str, d: int) -> None:
        self.i, self.kind, self.d = i, kind, d


class Replay(GraphReplacement):
    """A traced replacement graph with the values it is replayed on: ``args`` for its
    input placeholders (after ``len(sources)`` size-symbol placeholders, each read from
    ``args[i]``'s size or stride), ``literals``: traced stand-in literal -> its value here.
    ``plan``: the graph's :class:`Plan`, when the caller keeps one."""

    def __init__(
        self,
        gm: fx.GraphModule,
        args: Sequence[Any],
        sources: Sequence[tuple[int, str, int]] = (),
        literals: dict[Any, Any] | None = None,
        plan: Plan | None = None,
        *,
        traced_on: bool = False,
    ) -> None:
        self.gm = gm
        #: ``gm`` was traced on ``args``' values themselves (in their graph's fake mode):
        #: the copies take the traced nodes' values (see :meth:`known_values`)
        self.traced_on = traced_on
        self._known: dict[Node, Any] = {}
        self.plan = plan or Plan(gm)
        self.args = list(args)
        self.sources = list(sources)
        self.literals = literals or {}
        self.made: list[tuple[Node, Node]] = []  # (traced node, its copy)
        self.result: tuple[Any, ...] = ()  # what it returned, per output of the match
        #: inner nodes of the match that other nodes still use (the improvements allow it):
        #: each gets the copy computing the same value, if the replacement has one
        self.shared: list[Node] = []
        self.chains: set[Node] = set()  # views and no-op casts the match saw through
        self._symbols: dict[Any, tuple[int, str, int]] | None = None  # size symbol -> source
        phs = self.plan.phs
        self.sym_phs = phs[: len(self.sources)]
        self.in_phs = phs[len(self.sources) :]
        if len(self.in_phs) != len(self.args):
            raise RewriteError(
                _Named("replace_with_graph"),
                f"the replacement graph takes {len(self.in_phs)} inputs, {len(self.args)} given",
            )

    def n_results(self) -> int:
        return self.plan.results

    def write(self, match: Any, bindings: dict[str, Any], editor: Editor) -> Any:
        graph = match.graph
        env: dict[Node, Any] = dict(zip(self.in_phs, self.args))
        sizes: dict[tuple, Any] = {}

        def size(i: int, kind: str, d: int) -> Any:
            key = (i, kind, d)
            if key not in sizes:
                src = self.args[i]
                try:
                    v = size_of(src, kind, d)
                except LookupError:
                    v = None
                if isinstance(v, int):
                    sizes[key] = v
                else:  # symbolic, or unknown: read it when the graph runs
                    op = (
                        torch.ops.aten.sym_size.int
                        if kind == "size"
                        else torch.ops.aten.sym_stride.int
                    )
                    sizes[key] = editor.create(graph, "call_function", op, (src, d), {})
            return sizes[key]

        for ph, (i, kind, d) in zip(self.sym_phs, self.sources):
            env[ph] = _SymRef(i, kind, d)

        def arg(a: Any) -> Any:
            if a.__class__ is Node:
                v = env[a]
                return size(v.i, v.kind, v.d) if v.__class__ is _SymRef else v
            if self.literals and type(a) in (int, float):
                hit = self.literals.get((type(a), a))
                if hit is not None:
                    return hit[0]
            return a

        sized = self.plan.sizes
        known = self._known = {}
        keep_values = self.traced_on and not self.literals
        for n in self.plan.nodes:
            args, kwargs = map_aggregate(n.args, arg), map_aggregate(n.kwargs, arg)
            if n.op == "get_attr":
                env[n] = self._attr(graph, n, editor)
                continue
            if n.op != "call_function":
                raise NotImplementedError(f"replacement graphs may not contain {n.op} nodes ({n})")
            if n in sized:
                if not _has_node((args, kwargs)):
                    env[n] = n.target(*args, **kwargs)  # a size, computed from static sizes
                    continue
                static = self._static(n)
                if static is not None:  # x.numel() and the like, where the sizes are static
                    env[n] = static
                    continue
            env[n] = new = editor.create(graph, "call_function", n.target, args, kwargs)
            for key in _META:
                if key in n.meta:
                    new.meta[key] = n.meta[key]
            if keep_values and "val" in n.meta:
                known[new] = n.meta["val"]
            self.made.append((n, new))
        result = map_aggregate(self.plan.out, arg)
        self.result = tuple(result) if isinstance(result, (list, tuple)) else (result,)
        if self.shared:
            return self.result + tuple(self._same_as(graph, n, editor) for n in self.shared)
        return tuple(result) if isinstance(result, (list, tuple)) else result

    def known_values(self) -> dict[Node, Any]:
        """The values of the nodes the last :meth:`write` made, where the trace was made on
        the very values this replay reads (the first sizes of a signature, traced in the
        graph's fake mode with the match's values, as Inductor traces every match): each
        copy computes what its traced node computed there, so it takes that value, as
        Inductor's replacement nodes take the trace's."""
        return self._known

    def _static(self, n: Node) -> int | None:
        """The value of the traced size ``n`` (a query on a tensor, as ``x.numel()`` in a
        decomposition, rather than arithmetic on the size symbols) where every size symbol
        it depends on is static in this match; else None (it is computed in the graph)."""
        expr = getattr(getattr(n.meta.get("val"), "node", None), "expr", None)
        if expr is None:
            return None
        if self._symbols is None:
            self._symbols = {}
            for ph, src in zip(self.sym_phs, self.sources):
                sym = getattr(getattr(ph.meta.get("val"), "node", None), "expr", None)
                if sym is not None and getattr(sym, "is_Symbol", False):
                    self._symbols[sym] = src
        sub = {}
        for sym in expr.free_symbols:
            src = self._symbols.get(sym)
            if src is None:
                return None
            i, kind, d = src
            try:
                v = size_of(self.args[i], kind, d)
            except LookupError:
                return None
            if type(v) is not int:
                return None
            sub[sym] = v
        v = expr.xreplace(sub)
        return int(v) if getattr(v, "is_Integer", False) else None

    def _same_as(self, graph: fx.Graph, old: Node, editor: Editor) -> Node:
        """A node of the replacement computing what ``old`` computes (the same op on the
        same values) — for a view or no-op cast the match saw through, that op redone on
        the replacement's value of its input — else ``old`` itself (it stays for its other
        users)."""
        for _, new in self.made:
            if new.target is old.target and new.args == old.args and new.kwargs == old.kwargs:
                return new
        if old in self.chains and isinstance(old.args[0], Node):
            src = self._same_as(graph, old.args[0], editor)
            if src is not old.args[0]:
                new = editor.create(
                    graph, old.op, old.target, (src, *old.args[1:]), dict(old.kwargs)
                )
                self.made.append((old, new))
                return new
        return old

    def _attr(self, graph: fx.Graph, n: Node, editor: Editor) -> Node:
        value = self.gm.get_submodule(n.target) if _is_module(self.gm, n.target) else None
        owner = graph.owning_module
        if owner is None:
            raise NotImplementedError(
                "a replacement with attributes needs a graph in a GraphModule"
            )
        if value is None:
            value = getattr(self.gm, n.target)
        existing = next((name for name, m in owner.named_modules() if m is value), None)
        if existing is None:
            base = str(n.target).replace(".", "_")
            existing = base
            i = 0
            while hasattr(owner, existing):
                i += 1
                existing = f"{base}_{i}"
            if isinstance(value, torch.nn.Module):
                owner.register_module(existing, value)
            else:
                owner.register_buffer(existing, value, persistent=False)
        return editor.create(graph, "get_attr", existing, (), {})


def _is_module(gm: fx.GraphModule, target: str) -> bool:
    try:
        return isinstance(gm.get_submodule(target), torch.nn.Module)
    except AttributeError:
        return False


class _Named:
    """A stand-in rule for error messages about replacements outside any pattern entry."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.location = ""


def _has_node(x: Any) -> bool:
    if isinstance(x, Node):
        return True
    if isinstance(x, (list, tuple)):
        return any(_has_node(v) for v in x)
    if isinstance(x, dict):
        return any(_has_node(v) for v in x.values())
    return False


# ----- applying -----------------------------------------------------------------------------
def replay_edit(match: Any, replay: Replay, name: str) -> Replace:
    """The edit replacing ``match`` (Inductor's Match) by ``replay`` (nothing changes yet);
    once it is made, its ``done`` gives the new outputs Inductor's metadata and tells the
    pass run applying the match (``match.run``) what changed."""
    outs = [o for o in match.output_nodes() if o is not None]
    if not outs:
        raise RewriteError(_Named(name), "the match has no output to replace")
    count = replay.n_results()
    pick: list[int] | None = None
    extra_nodes: list[Node] = []
    if count != len(outs):
        if len(outs) != 1:
            raise RewriteError(
                _Named(name),
                f"the replacement returns {count} values for the pattern's {len(outs)} outputs",
            )
        old = outs[0]
        users = list(old.users)
        if any(u.op != "call_function" or u.target is not operator.getitem for u in users):
            raise RewriteError(
                _Named(name),
                f"the replacement returns {count} values for one output, %{old.name}, which "
                "is used other than through getitem",
            )
        outs, pick, extra_nodes = users, [u.args[1] for u in users], users
    else:
        inside = set(_nodes(match, match.found))
        keep = [i for i, o in enumerate(outs) if o in inside]
        if len(keep) < len(outs):  # an output that is an input of the match: its readers
            outs, pick = [outs[i] for i in keep], keep  # keep reading it
    found = match.found
    nodes = _nodes(match, found) + extra_nodes
    region = set(nodes).union(found.dropped if found is not None else ())
    out_set = set(outs)
    replay.shared = [n for n in nodes if n not in out_set and any(u not in region for u in n.users)]
    replay.chains = {n for chain in (found.chains if found is not None else ()) for n in chain}
    fx_match = _FxMatch(
        rule=found.rule if found is not None else _hand_made_rule(),
        root=outs[0],
        bindings=dict(found.bindings) if found is not None else {},
        nodes=nodes,
        outputs=outs + replay.shared,
        dropped=list(found.dropped) if found is not None else [],
        chains=list(found.chains) if found is not None else [],
        seen_through=list(found.seen_through) if found is not None else [],
    )
    replacement = _Pick(replay, pick) if pick is not None else replay
    run = match.run
    old_outs = list(outs)

    def done(old: list[Node], new: list[Node]) -> None:
        _transfer_meta(old_outs, replay.result, set(new))
        if run is not None:
            run.replaced(old, new)

    return Replace(fx_match, replacement, name, done)


def apply_replay(match: Any, replay: Replay, name: str) -> list[Node]:
    """Replace ``match`` (Inductor's Match) by ``replay`` now, through the rewriter of the
    run applying it (else one of the run in progress); returns the nodes added (none if
    the debug counter said no). A pass run's own matches are edits it hands the rewrite
    driver instead (:func:`replay_edit`); this is for a handler's or a user's call."""
    edit = replay_edit(match, replay, name)
    run = match.run
    rewriter = run.rewriter if run is not None else Rewriter(_module_or_graph(match.graph), name)
    if not rewriter.apply(edit.match, replacement=edit.replacement, name=name):
        return []
    edit.done(edit.match.nodes, rewriter.created)
    return [new for _, new in replay.made if not is_erased(new)]


def _nodes(match: Any, found: Any) -> list[Node]:
    if found is None:
        return list(match.nodes)
    seen = dict.fromkeys(found.nodes)
    for n in match.nodes:
        seen.setdefault(n, None)
    return list(seen)


class _Pick(GraphReplacement):
    """A replacement returning several values for one output: each getitem user of the
    output takes the value it indexes."""

    def __init__(self, replay: Replay, pick: list[int]) -> None:
        self.replay = replay
        self.pick = pick

    def write(self, match: Any, bindings: dict[str, Any], editor: Editor) -> Any:
        shared = self.replay.shared
        self.replay.shared = []
        values = self.replay.write(match, bindings, editor)
        self.replay.shared = shared
        picked = tuple(values[i] for i in self.pick)
        self.replay.result = picked
        return picked + tuple(self.replay._same_as(match.graph, n, editor) for n in shared)

    def known_values(self) -> dict[Node, Any]:
        return self.replay.known_values()


@functools.cache
def _hand_made_rule() -> Any:
    """The rule of a match made by hand (no fxpass match behind it): it matches anything;
    what replaces the match is the replay, passed to the rewriter with the entry's name."""
    from ...rewrite import P, Rule

    return Rule(P.any(), lambda: None, contained=False, location="")


def _module_or_graph(graph: fx.Graph) -> Any:
    return graph.owning_module if graph.owning_module is not None else graph


def _transfer_meta(old_outs: list[Node], values: Sequence[Any], created: set[Node]) -> None:
    """Inductor's metadata on the replacement's outputs: what the replaced node carried."""
    for old, new in zip(old_outs, values):
        if new in created:
            for key in _META:
                if key in old.meta:
                    new.meta[key] = old.meta[key]


def replace_with_graph(match: Any, replacement_graph: Any, args: Sequence[Any]) -> list[Node]:
    """``Match.replace_with_graph``: ``replacement_graph`` (a GraphModule) in place of the match."""
    if not isinstance(replacement_graph, fx.GraphModule):
        raise TypeError(
            f"replace_with_graph needs a GraphModule, got {type(replacement_graph).__name__}"
        )
    name = match.run.entry_name if match.run is not None else "replace_with_graph"
    return apply_replay(match, Replay(replacement_graph, args), name)
