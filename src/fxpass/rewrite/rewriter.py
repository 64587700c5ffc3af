"""The rewriter: the one place where rewrites change the graph.

Every change goes through :class:`Rewriter`, which asks the run's editor before each
rewrite (:meth:`fxpass.edit.editor.Editor.allow`: a debug counter may say no, which is how
bisection stops after the k-th rewrite), builds the replacement, fills in metadata, rewires
and erases, and tells the instrumentation (:meth:`~fxpass.edit.editor.Editor.notify`). A
match is validated completely before anything changes, and a replacement that raises or
declines leaves the graph as it was: no rewrite is ever half-applied.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import torch
from torch import fx
from torch._subclasses.fake_tensor import FakeTensor
from torch.fx import Node, Proxy
from torch.fx.node import map_aggregate
from torch.fx.proxy import GraphAppendingTracer

from ..core.errors import FxpassError
from ..edit.dialect_writer import Spelling
from ..edit.editor import Change, Editor
from ..edit.location import short
from ..fxutil.dialect import graph_is_edge
from ..fxutil.fx_internals import is_erased, nodes_between
from .constraint import value_of
from .match import RuleStats
from .metadata import MetaPropagator
from .order import TopoOrder, users_before
from .region import Match, _droppable
from .replay import ABSENT, Recorded, signature
from .rule import GraphReplacement

__all__ = ["ReplacementTypeError", "RewriteError", "Rewriter", "constant_node"]


class RewriteError(FxpassError):
    """A rule's replacement raised or returned something that cannot replace the match."""

    def __init__(self, rule: Any, message: str, name: str | None = None) -> None:
        self.rule = rule
        name = rule.name if name is None else name
        super().__init__(f"rule '{name}' (written at {short(rule.location)}): {message}")


class ReplacementTypeError(RewriteError, TypeError):
    """A replacement returned something that is not a value of the graph (a number, a node
    of another graph, an erased node). A ``TypeError`` too: code written against Inductor's
    pattern matcher, which fails there with one, catches it as before."""


class _Tracer(GraphAppendingTracer):
    """Appends proxy calls to the graph at its insertion point, through the editor (a lean
    ``create_proxy``)."""

    def __init__(self, graph: fx.Graph, editor: Editor) -> None:
        super().__init__(graph)
        self.editor = editor

    def create_proxy(self, kind, target, args, kwargs, name=None, type_expr=None, *_, **__):
        # unwrap first: an argument may create its node on demand (torch's ``x.shape`` proxy);
        # a tensor the replacement made (``torch.tensor(2.0)``) is read from the module
        args = map_aggregate(args, self._arg)
        kwargs = map_aggregate(kwargs, self._arg)
        node = self.editor.create(
            self.graph, kind, target, args, kwargs, name=name, type_expr=type_expr
        )
        return _Proxy(node, self)

    def _arg(self, a: Any) -> Any:
        if isinstance(a, Proxy):
            return a.node
        if isinstance(a, torch.Tensor):
            return constant_node(self.graph, a, self.editor)
        return a


class _Proxy(Proxy):
    """torch's Proxy with a leaner ``__torch_function__`` (no pytree walks per call)."""

    def __getitem__(self, key: Any) -> _Proxy:
        tracer = self.tracer
        node = tracer.editor.create(
            tracer.graph, "call_function", operator.getitem, (self.node, key)
        )
        return _Proxy(node, tracer)

    @classmethod
    def __torch_function__(cls, orig, types, args=(), kwargs=None):
        tracer = _tracer_in(args) or _tracer_in(tuple((kwargs or {}).values()))
        if isinstance(orig, _OpOverload):
            kind, target = "call_function", orig
        elif isinstance(orig, torch._ops.OpOverloadPacket) and orig.overloads() == ["default"]:
            kind, target = "call_function", orig.default  # what an ExportedProgram asks for
        elif torch.overrides.is_tensor_method_or_property(orig):
            kind, target = "call_method", orig.__name__
        else:
            kind, target = "call_function", orig
        return tracer.create_proxy(kind, target, tuple(args or ()), dict(kwargs or {}))


_OpOverload = torch._ops.OpOverload


def _tracer_in(args: tuple) -> Any:
    for a in args:
        if isinstance(a, Proxy):
            return a.tracer
        if isinstance(a, (list, tuple)):
            t = _tracer_in(a)
            if t is not None:
                return t
    return None


def _unwrap(a: Any) -> Any:
    return a.node if isinstance(a, Proxy) else a


def constant_node(graph: fx.Graph, tensor: torch.Tensor, editor: Editor) -> Node:
    """A ``get_attr`` node reading ``tensor``, made at the graph's insertion point: a tensor
    constant of a replacement stays a constant of the module (a buffer, added once per
    tensor), never a literal argument, which generated code cannot spell. When passes run
    on an ExportedProgram, fxpass lifts it into a constant input of the program."""
    if isinstance(tensor, FakeTensor) or tensor.device.type == "meta":
        raise ValueError(
            f"a replacement used a {'fake' if isinstance(tensor, FakeTensor) else 'meta'} "
            "tensor as an argument; pass the graph value it stands for (the bound node) instead"
        )
    owner = graph.owning_module
    if owner is None:
        raise ValueError(
            "a replacement made a tensor constant, but the graph belongs to no GraphModule "
            "that could hold it"
        )
    name = next((n for n, b in owner.named_buffers(recurse=False) if b is tensor), None)
    if name is None:
        i = 0
        while hasattr(owner, f"_tensor_constant{i}"):
            i += 1
        name = f"_tensor_constant{i}"
        value = tensor.detach() if tensor.requires_grad else tensor
        owner.register_buffer(name, value, persistent=False)
    return editor.create(graph, "get_attr", name, (), {})


def _has_tensor(x: Any) -> bool:
    if isinstance(x, torch.Tensor):
        return True
    if isinstance(x, (list, tuple)):
        return any(_has_tensor(v) for v in x)
    if isinstance(x, dict):
        return any(_has_tensor(v) for v in x.values())
    return False


class Rewriter:
    """Applies matches to one graph. Create one per run.

    ``editor``: the editor the rewrites go through (a pass's ``ctx.editor``; without one, the
    run in progress's, ``Editor.current``); ``pass_name`` is recorded in the provenance of
    new nodes (default: the editor's, the running pass).
    """

    def __init__(
        self,
        gm: fx.GraphModule | fx.Graph,
        pass_name: str | None = None,
        *,
        editor: Editor | None = None,
    ) -> None:
        self.graph: fx.Graph = gm.graph if isinstance(gm, fx.GraphModule) else gm
        self.gm = gm if isinstance(gm, fx.GraphModule) else self.graph.owning_module
        if editor is None:
            editor = Editor.current(pass_name)
        elif pass_name is not None:
            editor = editor.naming(pass_name)
        self.editor = editor
        self.ctx = self.editor.ctx
        self.pass_name = self.editor.pass_name
        self._order: TopoOrder | None = None
        self._spelling: Spelling | None = None
        self._tracer = _Tracer(self.graph, self.editor)
        self.meta = MetaPropagator()
        self.rewrites = 0
        self.created: list[Node] = []  # new nodes of the last rewrite
        self.rewired: list[Node] = []  # the values that took over its outputs' uses

    # ----- the topological index -------------------------------------------------------
    def order(self) -> TopoOrder:
        """Positions of the graph's nodes (torch's sort keys, which torch keeps current)."""
        if self._order is None:
            self._order = TopoOrder(self.graph)
        return self._order

    def spelling(self) -> Spelling:
        """How this (Edge) graph's new nodes call ops (read once, at its first Edge match)."""
        if self._spelling is None:
            self._spelling = Spelling(self.graph, edge=True)
        return self._spelling

    # ----- applying a match ---------------------------------------------------------------
    def apply(
        self,
        match: Match,
        stats: RuleStats | None = None,
        *,
        replacement: GraphReplacement | None = None,
        name: str | None = None,
    ) -> bool:
        """Replace ``match`` by its rule's replacement. False if skipped or declined.

        ``replacement`` replaces the match instead of the rule's own (a client that decides
        the replacement per match, e.g. compat's replay of a recorded Inductor replacement);
        ``name`` is the name the change is told and recorded under instead of the rule's.
        """
        rule = match.rule
        name = rule.name if name is None else name
        editor = self.editor
        if not editor.allow():
            if stats is not None:
                stats.skipped += 1
            return False
        # one change: told once, when the block ends; a replacement that raises tells nobody
        with editor.change("replace", name, match.nodes, location=rule.location) as change:
            new = self._replace(match, change, name, replacement)
        if new is None:
            if stats is not None:
                stats.declined += 1
            return False
        self.rewrites += 1
        self.created = new
        if stats is not None:
            stats.rewritten += 1
        return True

    def _replace(
        self, match: Match, change: Change, name: str, replacement: GraphReplacement | None
    ) -> list[Node] | None:
        """The edits of one rewrite (inside its change); the new nodes, or None (declined)."""
        rule = match.rule
        editor = self.editor
        outputs = match.outputs
        anchor = outputs[0]
        movers: list[Node] = []
        if len(outputs) > 1:
            order = self.order()
            anchor = max(outputs, key=order.__getitem__)
            movers = users_before(order, outputs, set(match.nodes), order[anchor])
        edge = graph_is_edge(match.nodes)
        recordings = rule.recordings if replacement is None and not edge else None
        key = None
        if recordings is not None:
            key = signature(match.bindings, self._names(rule, match), match.root)
        recorded = recordings.get(key) if key is not None else ABSENT
        if recorded is not ABSENT and recorded is not None:
            new, values = self._copy(recorded, match, anchor, outputs)
            donors = {v: o for o, v in zip(outputs, values) if v in new}
        else:
            new, values = self._build(match, anchor, name, replacement)
            if values is None:
                change.cancel()
                return None
            writer = replacement if replacement is not None else rule.replacement
            known = writer.known_values() if isinstance(writer, GraphReplacement) else None
            if edge:
                self.spelling().respell(new, editor, name)  # an Edge graph gets Edge ops
                known = None  # respelled: computed for the ops as they are now
            donors = {v: o for o, v in zip(outputs, values) if v in new}
            self.meta.values(new, donors, match.root, known=known)
            if key is not None:
                recordings.put(key, Recorded.of(new, values, match.bindings))
        if match.chains:
            values = self._replay(match, new, values, anchor, name)
            donors = {v: o for o, v in zip(outputs, values) if v in new}
        for m in movers:  # readers of an inner output must follow the replacement
            editor.move(m, before=anchor, rule=name)
        self.meta.provenance(
            new,
            donors,
            match.root,
            match.nodes,
            outputs=outputs,
            rule=name,
            pass_name=self.pass_name,
            location=rule.location,
        )
        new_set = set(new)
        for old, value in zip(outputs, values):
            if value is not old:
                editor.replace_all_uses(
                    old, value, name, erase_old=False, only=lambda u: u not in new_set
                )
        editor.erase_all([*match.dropped, *match.nodes], name)
        if match.seen_through:  # their readers inside the match are gone now
            editor.erase_all(_with_dropped_users(match.seen_through, rule.drop_users), name)
        unused = [n for n in new if not n.users and not n.is_impure()]
        if unused:  # e.g. a fused op's second result when the old value had no other reader
            editor.erase_all(unused, name)
            new = [n for n in new if not is_erased(n)]
        self.rewired = values  # the values that took over the outputs' uses
        change.new = new
        return new

    @staticmethod
    def _names(rule: Any, match: Match) -> Any:
        names = rule.replacement_names()
        return sorted(match.bindings) if names is None else names

    def _copy(
        self, recorded: Recorded, match: Match, anchor: Node, outputs: list[Node]
    ) -> tuple[list[Node], list[Node]]:
        """The recorded replacement's nodes made again before ``anchor`` for ``match``."""
        mode = self.meta.evaluator(self.graph).mode
        with self.graph.inserting_before(anchor):
            return recorded.write(
                self.graph,
                match.bindings,
                self.editor,
                lambda values: {v: o for o, v in zip(outputs, values)},
                mode,
            )

    def erase(self, node: Node, rule: str, location: str = "") -> bool:
        """Erase ``node``, which nothing uses. False if the context said no."""
        if node.users:
            raise ValueError(f"cannot erase %{node.name}: it still has users {list(node.users)}")
        editor = self.editor
        if not editor.allow():
            return False
        editor.erase(node, rule, location=location)
        self.rewrites += 1
        return True

    def _build(
        self, match: Match, anchor: Node, name: str, replacement: GraphReplacement | None
    ) -> tuple[list[Node], list[Node] | None]:
        """Run the replacement (``replacement``, else the rule's) before ``anchor``; (new
        nodes, values per output or None)."""
        rule = match.rule
        graph = self.graph
        before = anchor.prev
        tracer = self._tracer
        bindings = match.bindings
        # proxies only for what the replacement reads
        names = rule.replacement_names() if replacement is None else None
        if names is None:
            env = {k: _wrap(v, tracer) for k, v in bindings.items()}
        else:
            env = {k: _wrap(bindings[k], tracer) for k in names if k in bindings}
        try:
            with graph.inserting_before(anchor):
                if replacement is None:
                    result = rule.build(env, match, self.editor)
                else:
                    result = replacement.write(match, env, self.editor)
            self._constants(nodes_between(before, anchor))
            new = nodes_between(before, anchor)
            values = None if result is None else self._values(match, result, name)
        except Exception as e:
            self._undo(nodes_between(before, anchor))
            if isinstance(e, RewriteError):
                raise
            raise RewriteError(rule, f"the replacement raised {type(e).__name__}: {e}", name) from e
        if values is None:
            self._undo(new)
        return new, values

    def _constants(self, new: list[Node]) -> None:
        """Give every tensor a replacement put into a node's arguments as a literal (one it
        was bound to, or made) a ``get_attr`` node of its own (:func:`constant_node`)."""
        editor = self.editor
        for n in new:
            if not (_has_tensor(n.args) or _has_tensor(n.kwargs)):
                continue
            with self.graph.inserting_before(n):

                def arg(a: Any) -> Any:
                    if isinstance(a, torch.Tensor):
                        return constant_node(self.graph, a, editor)
                    return a

                args, kwargs = map_aggregate(n.args, arg), map_aggregate(n.kwargs, arg)
            editor.set_args(n, args, kwargs, rule="constant")

    def _replay(self, match: Match, new: list[Node], values: list[Node], anchor: Node, name: str):
        """Give each output back the shape the replaced node had: where a value has the
        shape of a chain's input and its output the shape of the chain's output (the match
        saw through the chain with P.through), apply the chain's ops to the value again.
        New nodes are appended to ``new``; returns the values to use."""
        out = list(values)
        for i, (old, value) in enumerate(zip(match.outputs, values)):
            want, have = _shape(old), _shape(value)
            if want is None or have is None or want == have:
                continue
            chain = next(
                (c for c in match.chains if _shape(c[0].args[0]) == have and _shape(c[-1]) == want),
                None,
            )
            if chain is None:
                self._undo(new)
                raise RewriteError(
                    match.rule,
                    f"the replacement's value for %{old.name} has shape {list(have)}, the "
                    f"replaced node {list(want)}, and no view the match saw through maps one "
                    "to the other",
                    name,
                )
            made = []
            cur = value
            with self.graph.inserting_before(anchor):
                for c in chain:
                    cur = self.editor.create(
                        self.graph, c.op, c.target, (cur, *c.args[1:]), dict(c.kwargs)
                    )
                    made.append(cur)
            self.meta.values(made, {cur: old}, match.root)
            new.extend(made)
            out[i] = cur
        return out

    def _values(self, match: Match, result: Any, name: str) -> list[Node]:
        rule = match.rule
        outputs = match.outputs
        names = [*(None for _ in rule.roots), *rule.outputs]
        if isinstance(result, dict):
            root_names = [r.name for r in rule.roots]
            seq = []
            for i, out_name in enumerate(names):
                key = out_name if out_name is not None else root_names[i]
                if key in result:
                    seq.append(result[key])
                elif i == 0 and "root" in result:
                    seq.append(result["root"])
                else:
                    want = [n for n in [*root_names, *rule.outputs] if n]
                    raise RewriteError(
                        rule,
                        f"the replacement's dict has no value for output {key!r} (it needs {want})",
                        name,
                    )
        elif len(outputs) == 1 and not isinstance(result, (tuple, list)):
            seq = [result]
        elif isinstance(result, (tuple, list)) and not isinstance(result, Proxy):
            seq = list(result)
        else:
            seq = [result]
        if len(seq) != len(outputs):
            raise RewriteError(
                rule,
                f"the replacement returned {len(seq)} value(s) for {len(outputs)} output(s) "
                f"(roots, then {list(rule.outputs)})",
                name,
            )
        values = []
        for v in seq:
            v = v.node if isinstance(v, Proxy) else v
            if not isinstance(v, Node) or v.graph is not self.graph or is_erased(v):
                raise ReplacementTypeError(
                    rule,
                    f"the replacement must return graph values (nodes or proxies), got {v!r}",
                    name,
                )
            values.append(v)
        return values

    def _undo(self, nodes: Sequence[Node]) -> None:
        """Take back the nodes a replacement made (inside its change, which then tells
        nobody: it raises or is cancelled)."""
        for n in reversed(nodes):
            if not is_erased(n):
                self.editor.erase(n, "undo")


def _wrap(v: Any, tracer: Any) -> Any:
    if isinstance(v, Node):
        return _Proxy(v, tracer)
    if isinstance(v, (list, tuple)):
        return map_aggregate(v, lambda x: _Proxy(x, tracer) if isinstance(x, Node) else x)
    return v


def _with_dropped_users(nodes: list[Node], drop: frozenset) -> list[Node]:
    """``nodes`` and, for each used only by droppable checks (export's asserts), those."""
    out = list(nodes)
    for n in nodes:
        users = list(n.users)
        if users and all(u.op == "call_function" and _droppable(u, drop) for u in users):
            out.extend(users)
    return out


def _shape(node: Node) -> Any:
    val = value_of(node)
    return tuple(val.shape) if isinstance(val, torch.Tensor) else None
