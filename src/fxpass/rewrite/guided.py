"""A walk a client declares: which nodes, what to try at each, what to do with a match.

:func:`~fxpass.rewrite.rewrite` decides everything from its rules: graph order, the rules
filed under a node's op, each rule's replacement. A client with a policy of its own —
``fxpass.compat.inductor`` follows Inductor's: nodes from the last to the first, a list of
entries per target, a check on a match read back its own way, handlers that edit the graph
themselves — declares that policy as a :class:`Guide` and hands the graph once to
:func:`guided`, which walks, matches and edits:

* the guide's ``table`` files choices (:class:`Choice`) under ``(op, target)`` (a called module
  under its class); the driver visits every node calling a filed target, once, in graph
  order or (``reverse``) from the last to the first, as the graph stood when it started;
* at a node it takes each choice filed there in order, until the node is erased: tries its
  rules, each by its matcher policy (the first that matches gives the match), and asks the
  choice's hook, ``decide(node, found, tier, rewriter)``, what to do: the client decides,
  the driver does. The hook answers with an edit, or None;
* it makes the edit through the rewriter and its editor — :class:`Replace`: the match
  replaced by a replacement, as :meth:`Rewriter.apply <fxpass.rewrite.Rewriter.apply>`
  does; :class:`Surgery`: code of the client's that edits the graph itself (an Inductor
  handler), run with the graph watched (:func:`~fxpass.edit.watch.watch_edits`), what it
  made and erased told through the editor as one change unless it went through the
  rewriter — and calls the edit's ``done(old, new)``, if any, with what it erased and made;
* after the walk it calls the guide's ``finish(graph)``, if any.

See docs/rewrite.md ("A walk of your own") for an example.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Union

from torch import fx
from torch.fx import Node

from ..core.context import PassContext
from ..edit.watch import watch_edits
from ..fxutil.fx_internals import is_erased, sort_key
from .interpreted import Interpreter
from .match import MatchState, attempt
from .region import Match, MatchedRule
from .rewriter import Rewriter
from .rule import GraphReplacement

__all__ = ["Choice", "Guide", "Replace", "Surgery", "guided"]

_PLAIN = Interpreter()


Edit = Union["Replace", "Surgery"]


@dataclass(frozen=True)
class Choice:
    """One thing to try at a node: ``tries``, (rule, matcher policy) pairs in order (a policy
    of None: the plain matcher, compiled where it can be), and
    ``decide(node, found, tier, rewriter)``, the client's hook: ``found`` is the match of
    ``tries[tier]`` (None, and ``tier`` -1, when none matched), ``rewriter`` the one the
    edit will go through; it returns the edit to make, or None."""

    tries: tuple[tuple[MatchedRule, Interpreter | None], ...]
    decide: Callable[[Node, Match | None, int, Rewriter], Edit | None]


@dataclass
class Replace:
    """Replace ``match`` by ``replacement`` (None: its rule's own), told and recorded under
    ``name`` (None: the rule's); then ``done(old, new)``, if given, with the nodes it
    replaced and those it made."""

    match: Match
    replacement: GraphReplacement | None = None
    name: str | None = None
    done: Callable[[list[Node], list[Node]], Any] | None = None


@dataclass
class Surgery:
    """Run ``edit()``, which edits the graph itself: what it makes and erases is one change
    named ``name``; then ``done(old, new)``, if given, with the nodes it erased and made."""

    edit: Callable[[], Any]
    name: str
    done: Callable[[list[Node], list[Node]], Any] | None = None


@dataclass(frozen=True)
class Guide:
    """A client's walk, declared (see the module docstring): ``table`` maps ``(op,
    target)`` — a called module's class for ``call_module`` — to the choices to try at its
    nodes, in order; ``reverse``: from the last node to the first; ``aliases``: target ->
    the target its nodes are filed under; ``finish(graph)``: called after the walk."""

    table: Mapping[tuple[str, Any], Sequence[Choice]]
    reverse: bool = False
    aliases: Mapping[Any, Any] = field(default_factory=dict)
    finish: Callable[[fx.Graph], Any] | None = None


def guided(
    gm: fx.GraphModule | fx.Graph,
    guide: Guide,
    *,
    pass_name: str | None = None,
    ctx: PassContext | None = None,
) -> int:
    """Walk ``gm`` as ``guide`` declares (see the module docstring); the number of edits
    made.

    Every edit goes through one :class:`~fxpass.rewrite.Rewriter` and its editor: ``ctx``'s
    (the context of the pass calling), else the run in progress's (``Editor.current``);
    ``pass_name`` names the new nodes' pass in their provenance."""
    if isinstance(gm, fx.GraphModule):
        graph = gm.graph
    else:
        graph = gm
    visits = _visits(graph, guide)
    owner = graph.owning_module
    table, aliases = guide.table, guide.aliases
    rw = Rewriter(gm, pass_name, editor=ctx.editor if ctx is not None else None)
    st = MatchState(order=rw.order)
    made = 0
    for node in visits:
        op, target = node.op, node.target
        if op == "call_module":
            if owner is None:
                raise ValueError(
                    f"%{node.name} calls a module, but its graph belongs to no GraphModule: "
                    "walk the GraphModule instead"
                )
            target = type(owner.get_submodule(target))
        elif aliases:
            target = aliases.get(target, target)
        for choice in table.get((op, target), ()):
            if is_erased(node):
                break
            found, tier = None, -1
            for i, (rule, how) in enumerate(choice.tries):
                if attempt(rule, node, st, how or _PLAIN):
                    found, tier = st.found, i
                    break
            edit = choice.decide(node, found, tier, rw)
            if edit is None:
                continue
            if isinstance(edit, Replace):
                if not rw.apply(edit.match, replacement=edit.replacement, name=edit.name):
                    continue
                old, new = edit.match.nodes, rw.created
            else:
                rewrites = rw.rewrites
                new, old = [], []
                with watch_edits(graph, new.append, old.append):
                    edit.edit()
                new = [n for n in new if not is_erased(n)]
                if rw.rewrites == rewrites and (new or old):  # else the rewriter told
                    rw.editor.notify("replace", edit.name, old, new)
            made += 1
            if edit.done is not None:
                edit.done(old, new)
    if guide.finish is not None:
        guide.finish(graph)
    return made


def _visits(graph: fx.Graph, guide: Guide) -> list[Node]:
    """The nodes calling a target of the table (any called module if one is filed), each
    once, in graph order or reversed."""
    also: dict[int, list[Any]] = {}
    for alias, target in guide.aliases.items():
        also.setdefault(id(target), []).append(alias)
    nodes: list[Node] = []
    modules = False
    for op, target in guide.table:
        if op == "call_module":
            modules = True
            continue
        nodes.extend(graph.find_nodes(op=op, target=target, sort=False))
        for alias in also.get(id(target), ()):
            nodes.extend(graph.find_nodes(op=op, target=alias, sort=False))
    if modules:
        nodes.extend(graph.find_nodes(op="call_module", sort=False))
    return sorted(set(nodes), key=sort_key, reverse=guide.reverse)
