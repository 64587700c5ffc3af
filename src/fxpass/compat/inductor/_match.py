"""Inductor's ``Match``: what a handler or an ``extra_check`` receives.

``kwargs`` (the values of ``KeywordArg``\\ s), ``args`` (of ``Arg``\\ s, depth first), ``nodes``
(the matched nodes, inputs before users), ``targets``, ``output_node()`` / ``output_nodes()``,
``replace_by_example``, ``replace_with_graph`` and ``erase_nodes`` behave as Inductor's. A match
is read back from fxpass's (:func:`assemble`): every pattern expression was bound to what it
matched under a name, so nothing is matched twice.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from torch import fx
from torch.fx import Node

from ...edit.editor import Editor
from ...fxutil.fx_internals import is_erased
from ._compile import Compiled
from ._exprs import (
    Arg,
    ExclusiveKeywordArg,
    FailedMatch,
    KeywordArg,
    ListOf,
    MultiOutputPattern,
    PatternExpr,
    _TargetArgsExpr,
    _TargetExprVarArgs,
)

__all__ = ["Match", "MatchContext", "assemble", "read_back"]


class MatchContext:
    """What Inductor keeps while matching: the pattern's ``outputs``, the node each pattern
    expression matched (``pattern_to_node``) and the ``graph``."""

    def __init__(
        self,
        outputs: list[PatternExpr | None],
        pattern_to_node: dict[PatternExpr, Node | None] | None = None,
        *,
        graph: fx.Graph,
    ) -> None:
        self.outputs = outputs
        self.pattern_to_node = dict(pattern_to_node or {})
        self.graph = graph
        self.exclusive_node_set: list[Any] = []


class Match:
    """A successful match (see the module docstring).

    Besides Inductor's fields, fxpass's own, public, set by whoever makes or applies it:

    * ``found``: fxpass's :class:`~fxpass.rewrite.Match` this one was read back from (its
      bindings, nodes, dropped nodes and chains), or None for a match made by hand;
    * ``extra``: True when only the relaxed rules (the improvements) found it;
    * ``run``: the pass run applying it (its rewriter, entry name and match state), or None
      outside ``PatternMatcherPass.apply``;
    * ``replay``: the replacement recorded when the entry's check accepted the match, which
      applying it replays (a ``Replay``), or None.
    """

    def __init__(
        self,
        ctx: MatchContext,
        pattern: PatternExpr,
        args: Sequence[Any] | None = None,
        kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.pattern = pattern
        self.args = list(args or [])
        self.kwargs = dict(kwargs or {})
        self.nodes: list[Node] = []
        self.targets: dict[PatternExpr, Any] = {}
        self.ctx = ctx
        self.replacement_graph: fx.GraphModule | None = None
        self.found: Any = None
        self.run: Any = None
        self.extra = False
        self.replay: Any = None

    @property
    def graph(self) -> fx.Graph:
        return self.ctx.graph

    def extend(self, other: Match) -> None:
        for key in self.kwargs.keys() & other.kwargs.keys():
            if self.kwargs[key] != other.kwargs[key]:
                raise FailedMatch("kwarg mismatch: {}", key)
        self.args.extend(other.args)
        self.nodes.extend(other.nodes)
        self.kwargs.update(other.kwargs)
        self.targets.update(other.targets)

    def bundle(self) -> Match:
        self.args = [tuple(self.args)] if self.args else []
        return self

    def output_nodes(self) -> list[Node | None]:
        """The node of each of the pattern's outputs (None for an unused one)."""
        p2n = self.ctx.pattern_to_node
        return [p2n.get(p) if p is not None else None for p in self.ctx.outputs]

    def output_node(self) -> Node:
        """The node of the pattern's first output."""
        return next(n for n in self.output_nodes() if n)

    def erase_nodes(self) -> None:
        """Erase the matched nodes nothing uses any more (users first), through the editor."""
        editor = self.run.rewriter.editor if self.run is not None else Editor.current()
        for n in reversed(self.nodes):
            if not is_erased(n) and not n.users:
                editor.erase(n, _rule_name(self))

    def replace_with_graph(self, replacement_graph: Any, args: Sequence[Any]) -> list[Node]:
        """Put ``replacement_graph`` (a GraphModule) in place of the match, its placeholders
        taking ``args``; returns the nodes added."""
        from ._replay import replace_with_graph

        return replace_with_graph(self, replacement_graph, args)

    def replace_by_example(
        self,
        replacement_fn: Callable[..., Any],
        args: Sequence[Any],
        trace_fn: Callable[..., Any] | None = None,
        run_functional_passes: bool = True,
    ) -> list[Node]:
        """Put ``replacement_fn``, traced, in place of the match (its outputs take over the
        pattern's outputs; ``args`` are graph values or literals). The function is traced
        once per argument signature (dtypes, devices, literals) with symbolic sizes, and
        replayed with each match's sizes; Inductor traces it for every match."""
        from ._recipes import replace_by_example

        return replace_by_example(self, replacement_fn, args, trace_fn, run_functional_passes)

    def __repr__(self) -> str:
        return f"Match(..., {self.args}, {self.kwargs})"


def _rule_name(m: Match) -> str:
    run = m.run
    return run.entry_name if run is not None else "pattern_matcher"


_ARG, _KW, _NODE, _VARARGS, _OTHER = range(5)


def _steps(compiled: Compiled) -> list[tuple] | None:
    """The order in which :func:`assemble` visits the expressions, worked out once: (what,
    expression, binding name); None for a pattern with a ``ListOf`` (visited per match)."""
    steps: list[tuple] = []
    seen: set[int] = set()
    names = compiled.names

    def walk(e: PatternExpr) -> bool:
        if id(e) in seen:
            return True
        seen.add(id(e))
        name = names.get(id(e))
        if isinstance(e, Arg):
            steps.append((_ARG, e, name))
        elif isinstance(e, (KeywordArg, ExclusiveKeywordArg)):
            steps.append((_KW, e, name))
        elif isinstance(e, _TargetArgsExpr):
            if not all(walk(c) for c in e.children()):
                return False
            steps.append((_NODE, e, name))
        elif isinstance(e, _TargetExprVarArgs):
            steps.append((_VARARGS, e, name))
        elif isinstance(e, ListOf):
            return False
        elif isinstance(e, MultiOutputPattern):
            return all(walk(o) for o in e.outputs if o is not None)
        else:
            steps.append((_OTHER, e, name))
        return True

    return steps if walk(compiled.expr) else None


def assemble(compiled: Compiled, env: dict[str, Any], graph: fx.Graph) -> Match:
    """Inductor's match of ``compiled.expr`` from fxpass's bindings ``env``: what each
    pattern expression matched, gathered in the order Inductor's matcher gathers it."""
    ctx = MatchContext(compiled.outputs, graph=graph)
    top = Match(ctx, compiled.expr)
    steps = compiled.__dict__.get("steps", ...)
    if steps is ...:
        steps = compiled.__dict__["steps"] = _steps(compiled)
    if steps is not None:  # the common case: no list patterns, a flat walk
        p2n, args, kwargs, nodes, targets = (
            ctx.pattern_to_node,
            top.args,
            top.kwargs,
            top.nodes,
            top.targets,
        )
        for what, e, name in steps:
            node = env.get(name) if name is not None else None
            p2n[e] = node
            if what == _NODE:
                nodes.append(node)
                targets[e] = node.target
            elif what == _KW:
                kwargs[e.name] = node
            elif what == _ARG:
                args.append(node)
            elif what == _VARARGS:
                nodes.append(node)
                targets[e] = node.target
                args.extend(node.args)
                kwargs.update(node.kwargs)
        return top
    names = compiled.names
    multi_user = compiled.multi_user

    def visit(e: PatternExpr, into: Match, env: dict[str, Any], seen: set[int], p2n: Any) -> None:
        if id(e) in seen:
            return
        seen.add(id(e))
        name = names.get(id(e))
        node = env.get(name) if name is not None else None
        if p2n is not None:
            p2n[e] = node
        if isinstance(e, Arg):
            into.args.append(node)
        elif isinstance(e, (KeywordArg, ExclusiveKeywordArg)):
            into.kwargs[e.name] = node
        elif isinstance(e, _TargetArgsExpr):
            for child in e.children():
                visit(child, into, env, seen, p2n)
            into.nodes.append(node)
            into.targets[e] = node.target
        elif isinstance(e, _TargetExprVarArgs):
            into.nodes.append(node)
            into.targets[e] = node.target
            into.args.extend(node.args)
            into.kwargs.update(node.kwargs)
        elif isinstance(e, ListOf):
            whole = Match(ctx, e)
            keep = {i for i in seen if i in multi_user}
            for record in node or ():
                if record is None:
                    continue
                child = Match(ctx, e.pattern)
                visit(e.pattern, child, record, set(keep), None)
                whole.extend(child.bundle())
            into.extend(whole.bundle())
        elif isinstance(e, MultiOutputPattern):
            for out in e.outputs:
                if out is not None:
                    visit(out, into, env, seen, p2n)

    visit(compiled.expr, top, env, set(), ctx.pattern_to_node)
    return top


def read_back(compiled: Compiled, found: Any, *, extra: bool = False) -> Match:
    """Inductor's match of ``compiled.expr`` from ``found``, the match fxpass's matcher
    returned (its ``found``); ``extra``: only the relaxed rules found it."""
    m = assemble(compiled, found.bindings, found.graph)
    m.found = found
    m.extra = extra
    return m
