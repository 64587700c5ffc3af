"""The one way fxpass changes a graph: ask, edit, tell, record.

Every change a pass makes goes through an :class:`Editor`: it asks the run's debug counter
first (:meth:`Editor.allow`: a counter may say no, which is how bisection stops after the
k-th change), tells the run's instrumentation what changed (:meth:`Editor.notify`), and
gives new nodes the provenance of the nodes they stand for (:meth:`Editor.mark_new`). The
Rewriter, the library passes, ``InterpreterPass``, the partitioner, compat's drop-ins and the
targets all edit through it; outside a pipeline run every change is allowed and nobody is
told.

The edits: :meth:`~Editor.insert` (any node kind, next to an anchor), :meth:`~Editor.set_args`,
:meth:`~Editor.set_target`, :meth:`~Editor.replace_input`, :meth:`~Editor.replace_all_uses`,
:meth:`~Editor.erase`, :meth:`~Editor.erase_all`, :meth:`~Editor.move`, :meth:`~Editor.rename`;
each one tells the run on its own. Several edits that make one change (a rewrite: build the
replacement, rewire, erase the old nodes) go inside :meth:`Editor.change`, which tells the
run once when the block ends; inside it, :meth:`~Editor.create` and :meth:`~Editor.copy` make
nodes at the graph's insertion point (a replacement traced node by node), and the nodes made
get the change's provenance. ``create`` and ``copy`` also build a graph no run watches yet
(an interpreter pass's new graph).

Who listens is an :class:`EditListener`: anything with ``allow()``, ``notify(event)`` and
``pass_path`` (the names of the passes now running). A pipeline run's
:class:`~fxpass.PassContext` is one; while the run is active it is the one :func:`listening`
installed, and ``ctx.editor`` is an editor bound to it. A pass is handed its context and
edits through ``ctx.editor``; ``Editor(None)`` tells nobody (for a scratch graph: a pattern,
a graph being reassembled after the run); :meth:`Editor.current` is for code no context was
handed to (a public helper on a bare graph, torch calling back). The editor sits below the
pass infrastructure: it knows the listener's shape, not the pipeline.

>>> editor = ctx.editor                         # doctest: +SKIP
>>> if editor.allow():                          # doctest: +SKIP
...     editor.replace_all_uses(old, new, "my_rule")
>>> if editor.allow():                          # doctest: +SKIP
...     with editor.change("replace", "fuse", [add, norm]) as change:
...         fused = editor.insert(fused_op, (x, w), rule="fuse", origin=[add, norm], before=add)
...         editor.replace_all_uses(norm, fused, "fuse")
...         editor.erase(add, "fuse")
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from torch import fx
from torch.fx.node import map_arg

from ..fxutil.fx_internals import (
    dead_node_eraser,
    default_node_name,
    is_erased,
    release_name,
    rename_node,
    set_args_kwargs,
    sort_key,
)
from ..fxutil.fx_state import node_neighbours
from .location import caller_location, file_line
from .provenance import COPIED_META, node_sources, provenance_record

__all__ = [
    "Change",
    "ChangeEvent",
    "EditListener",
    "Editor",
    "active_listener",
    "listening",
]

_CURRENT: Any = object()
_NO_VALUE: Any = object()


@dataclass
class ChangeEvent:
    """One change to the graph made through the editor (or reported by a pass).

    ``kind`` is ``"replace"``, ``"insert"``, ``"erase"`` or ``"modify"``; ``rule`` names the
    rule or pass that made it; ``old`` and ``new`` are the nodes involved; ``index`` is the
    1-based number of this action in the run (what a ``DebugCounter`` counts).
    """

    kind: str
    rule: str
    old: Sequence[Any] = ()
    new: Sequence[Any] = ()
    index: int = 0
    location: str = ""


class EditListener(Protocol):
    """What an editor reports to: a pipeline run's ``PassContext`` is one."""

    pass_path: list[str]

    def allow(self) -> bool: ...

    def notify(self, event: ChangeEvent) -> None: ...


#: The run in progress: its context, as the listener of editors made without one. The one
#: context variable of a pass run; what reads it is code no context was handed to (a pass
#: that did not ask for ``ctx``, a public helper on a bare graph, torch calling back).
_LISTENER: contextvars.ContextVar[EditListener | None] = contextvars.ContextVar(
    "fxpass_context", default=None
)


def active_listener() -> EditListener | None:
    """The listener edits in this thread report to (the running pipeline's context), or None."""
    return _LISTENER.get()


@contextlib.contextmanager
def listening(listener: EditListener | None) -> Iterator[None]:
    """Route the edits made inside the block (by editors made without an explicit listener)
    to ``listener``; a pipeline run does this for its context."""
    token = _LISTENER.set(listener)
    try:
        yield
    finally:
        _LISTENER.reset(token)


class Change:
    """Several edits that make one change, told to the run once (see :meth:`Editor.change`).

    ``made`` collects the nodes the block inserted, created or copied; ``new`` (default:
    those of them still in their graph) is what the event names as new.
    """

    __slots__ = (
        "_cancelled",
        "_editor",
        "_outer",
        "kind",
        "location",
        "made",
        "new",
        "old",
        "rule",
    )

    def __init__(
        self, editor: Editor, kind: str, rule: str, old: Sequence[fx.Node], location: str
    ) -> None:
        self._editor = editor
        self.kind, self.rule, self.old, self.location = kind, rule, list(old), location
        self.new: list[fx.Node] | None = None
        self.made: list[fx.Node] = []
        self._cancelled = False
        self._outer = False

    def cancel(self) -> None:
        """Tell nobody: the block undid what it made, or only copied nodes into a graph no
        run watches."""
        self._cancelled = True

    def __enter__(self) -> Change:
        editor = self._editor
        if editor._open is None:  # an inner change is part of the outer one
            editor._open, self._outer = self, True
        else:
            self.made = editor._open.made
        return self

    def __exit__(self, kind: Any, error: Any, tb: Any) -> None:
        if not self._outer:
            return
        editor = self._editor
        editor._open = None
        if error is not None or self._cancelled:
            return
        new = self.new
        if new is None:
            new = self.new = [n for n in self.made if not is_erased(n)]
        unmarked = [n for n in new if not n.meta.get("from_node")]
        if unmarked and self.old:
            editor.mark_new(unmarked, self.old, self.rule, self.location)
        editor.notify(self.kind, self.rule, self.old, new, self.location)


class Editor:
    """Edits on behalf of one pass run (``ctx``: the listener, default the active one, as
    :meth:`current`; ``pass_name``: recorded in new nodes' provenance, default the pass
    running when the edit is made)."""

    __slots__ = ("_name", "_open", "ctx")

    def __init__(self, ctx: EditListener | None = _CURRENT, pass_name: str | None = None) -> None:
        self.ctx = _LISTENER.get() if ctx is _CURRENT else ctx
        self._name = pass_name
        self._open: Change | None = None

    @classmethod
    def current(cls, pass_name: str | None = None) -> Editor:
        """An editor for code no context was handed to: bound to the run in progress in this
        thread (the listener :func:`listening` installed), or to nobody outside a run.

        The one way to get an editor without a context: a public helper a user calls on a
        bare GraphModule (``fxpass.rewrite.rewrite``, ``replace_pattern``) or code torch
        calls back with no way to pass one. A pass is handed its context and edits through
        ``ctx.editor``; a graph no run watches is edited with ``Editor(None)``.
        """
        return cls(_LISTENER.get(), pass_name)

    def naming(self, pass_name: str | None) -> Editor:
        """An editor reporting to the same run that records ``pass_name`` (None: the running
        pass) in new nodes' provenance; this one when it already does."""
        if pass_name == self._name:
            return self
        return Editor(self.ctx, pass_name)

    @property
    def pass_name(self) -> str:
        """The pass new nodes' provenance names: the one given, else the running one."""
        if self._name is not None:
            return self._name
        path = self.ctx.pass_path if self.ctx is not None else None
        return path[-1] if path else "rewrite"

    @pass_name.setter
    def pass_name(self, name: str | None) -> None:
        self._name = name

    @property
    def journal(self) -> Any:
        """The run's :class:`~fxpass.edit.journal.Journal` (None outside a run): each edit
        tells it first what it will change, so that the run can undo it."""
        return getattr(self.ctx, "journal", None)

    # ----- asking and telling -----------------------------------------------------------
    def allow(self) -> bool:
        """May the pass make one more change? (A debug counter may say no.)"""
        ctx = self.ctx
        return ctx is None or ctx.allow()

    def notify(
        self,
        kind: str,
        rule: str,
        old: Sequence[fx.Node] = (),
        new: Sequence[fx.Node] = (),
        location: str | None = None,
    ) -> None:
        """Tell the run's instrumentation about one change (``location`` defaults to the
        calling pass's line). Inside :meth:`change` the change tells, once, at its end."""
        ctx = self.ctx
        if ctx is not None and self._open is None:
            if location is None:
                location = file_line(caller_location())
            ctx.notify(ChangeEvent(kind, rule, list(old), list(new), location=location))

    def change(
        self, kind: str, rule: str, old: Sequence[fx.Node] = (), *, location: str | None = None
    ) -> Change:
        """A block whose edits make one change (``with editor.change(...) as change:``).

        The edits inside tell nobody on their own; when the block ends without an error the
        run is told once: ``kind``, ``rule``, the ``old`` nodes and ``change.new`` (default:
        the nodes the block made that are still in the graph). New nodes without provenance
        get ``old``'s. ``change.cancel()`` tells nobody. Ask :meth:`allow` first: one change
        is one action of the debug counter. A change inside another is part of it.
        """
        if location is None:
            location = file_line(caller_location())
        return Change(self, kind, rule, old, location)

    def mark_new(
        self,
        new: Sequence[fx.Node],
        replaced: Sequence[fx.Node],
        rule: str,
        location: str | None = None,
        *,
        inherit: bool = True,
    ) -> None:
        """Give nodes the pass created torch's ``from_node`` and fxpass's provenance naming
        ``replaced``, and (``inherit``) the source metadata of the first replaced node."""
        if location is None:
            location = file_line(caller_location())
        first = replaced[0] if replaced and inherit else None
        sources = node_sources(replaced, self.pass_name)
        names = [n.name for n in replaced]
        for node in new:
            if first is not None:
                for key in COPIED_META:
                    if key in first.meta and key not in node.meta:
                        node.meta[key] = first.meta[key]
            node.meta["from_node"] = list(sources)
            node.meta["fxpass_provenance"] = provenance_record(
                rule, self.pass_name, names, location
            )

    # ----- making nodes -----------------------------------------------------------------
    def insert(
        self,
        target: Any,
        args: tuple[Any, ...] = (),
        kwargs: Mapping[str, Any] | None = None,
        *,
        rule: str,
        origin: Sequence[fx.Node],
        before: fx.Node | None = None,
        after: fx.Node | None = None,
        op: str = "call_function",
        name: str | None = None,
        type_expr: Any = None,
        val: Any = _NO_VALUE,
        inherit: bool = True,
    ) -> fx.Node:
        """Create one node right ``before`` or ``after`` an anchor and tell the run.

        ``origin`` names the nodes the new one stands for or serves (a fused op's replaced
        nodes, the matmul whose output a collective reduces, the producer whose event a
        stream op records): they become its ``from_node`` and provenance, and (``inherit``)
        it takes the first one's source metadata. ``val`` sets ``meta['val']``. ``op`` is any
        node kind: a ``placeholder`` or ``get_attr`` takes its name or attribute path as
        ``target``.

        >>> editor.insert(aten.relu.default, (x,), rule="my_rule", origin=[x], after=x)  # doctest: +SKIP
        """
        if (before is None) == (after is None):
            raise ValueError("Editor.insert: give exactly one of before= or after=")
        if not origin:
            raise ValueError(
                "Editor.insert: origin= must name at least one node the new node stands for "
                "(it becomes the node's from_node)"
            )
        anchor = before if before is not None else after
        graph = anchor.graph
        where = (
            graph.inserting_before(before) if before is not None else graph.inserting_after(after)
        )
        journal = self.journal
        if journal is not None:
            journal.before_create(graph)
        with where:
            node = graph.create_node(op, target, tuple(args), dict(kwargs or {}), name, type_expr)
        if journal is not None:
            journal.made(node)
        if val is not _NO_VALUE:
            node.meta["val"] = val
        self.mark_new([node], origin, rule, inherit=inherit)
        if self._open is not None:
            self._open.made.append(node)
        self.notify("insert", rule, origin, [node])
        return node

    def create(
        self,
        graph: fx.Graph,
        op: str,
        target: Any,
        args: tuple[Any, ...] = (),
        kwargs: Mapping[str, Any] | None = None,
        *,
        name: str | None = None,
        type_expr: Any = None,
    ) -> fx.Node:
        """A node at ``graph``'s insertion point, inside a :meth:`change` (which tells the
        run and gives it provenance) or in a graph no run watches yet.

        What ``graph.create_node`` makes, for less: the name torch derives from a target is
        computed once per target, and the arguments are set after creation (which skips
        torch's scan of every argument for raw symbolic values).
        """
        if name is None:
            hit = _NAMES.get(id(target))
            if hit is None or hit[0] is not target:
                hit = _NAMES[id(target)] = (target, default_node_name(graph, target))
            name = hit[1]
        journal = self.journal
        if journal is not None:
            journal.before_create(graph)
        node = graph.create_node(op, target, (), {}, name, type_expr)
        if args or kwargs:
            set_args_kwargs(node, args if type(args) is tuple else tuple(args), kwargs or {})
        if journal is not None:
            journal.made(node)
        if self._open is not None:
            self._open.made.append(node)
        return node

    def copy(
        self, node: fx.Node, arg_transform: Callable[[fx.Node], Any], *, into: fx.Graph
    ) -> fx.Node:
        """A copy of ``node`` (its metadata too) at ``into``'s insertion point, its inputs
        mapped by ``arg_transform``: as :meth:`create`, inside a :meth:`change` or in a
        graph no run watches yet."""
        journal = self.journal
        if journal is not None:
            journal.before_create(into)
        made = into.node_copy(node, arg_transform)
        if journal is not None:
            journal.made(made)
        if self._open is not None:
            self._open.made.append(made)
        return made

    # ----- changing nodes ---------------------------------------------------------------
    def set_args(
        self,
        node: fx.Node,
        args: tuple[Any, ...] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        *,
        rule: str,
    ) -> None:
        """Give ``node`` new arguments (``None`` keeps the old ones); the output node's
        ``args`` are the graph's outputs."""
        journal = self.journal
        if journal is not None:
            journal.before(node)
            journal.reads(_read_by(args, kwargs))
        if args is not None:
            node.args = tuple(args)
        if kwargs is not None:
            node.kwargs = dict(kwargs)
        self.notify("modify", rule, [node], [node])

    def set_target(
        self,
        node: fx.Node,
        target: Any,
        *,
        args: tuple[Any, ...] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        rule: str,
    ) -> None:
        """Make ``node`` call ``target`` (a placeholder: take that input name; a ``get_attr``:
        read that attribute), with new arguments where given."""
        journal = self.journal
        if journal is not None:
            journal.before(node)
            journal.reads(_read_by(args, kwargs))
        node.target = target
        if args is not None:
            node.args = tuple(args)
        if kwargs is not None:
            node.kwargs = dict(kwargs)
        self.notify("modify", rule, [node], [node])

    def replace_input(self, node: fx.Node, old: fx.Node, new: fx.Node, *, rule: str) -> None:
        """Make ``node`` read ``new`` wherever it read ``old``."""
        journal = self.journal
        if journal is not None:
            journal.before(node)
            journal.reads([new])
        node.replace_input_with(old, new)
        self.notify("modify", rule, [node, old], [node, new])

    def replace_all_uses(
        self,
        node: fx.Node,
        new: Any,
        rule: str,
        *,
        erase_old: bool = True,
        only: Callable[[fx.Node], bool] | None = None,
        propagate_meta: bool = False,
    ) -> list[fx.Node]:
        """Point every user of ``node`` (those ``only`` accepts, when given) at ``new`` and
        (by default) erase ``node`` if nothing uses it any more; the run is told once both
        are done. ``propagate_meta`` copies ``node``'s metadata onto ``new`` (torch's).
        Returns the users changed."""
        journal = self.journal
        if journal is not None:
            journal.before(node)
            journal.reads(node.users)
            journal.reads(_read_by(new))
        if only is None:
            users = node.replace_all_uses_with(new, propagate_meta=propagate_meta)
        else:
            users = node.replace_all_uses_with(
                new, delete_user_cb=only, propagate_meta=propagate_meta
            )
        if erase_old and not node.users:
            node.graph.erase_node(node)
        self.notify("replace", rule, [node], [new])
        return users

    def move(
        self,
        node: fx.Node,
        *,
        before: fx.Node | None = None,
        after: fx.Node | None = None,
        rule: str,
    ) -> None:
        """Move ``node`` right ``before`` or ``after`` another node of its graph."""
        if (before is None) == (after is None):
            raise ValueError("Editor.move: give exactly one of before= or after=")
        journal = self.journal
        if journal is not None:
            journal.before(node)
            journal.reads(
                [before, *node_neighbours(before)]
                if before is not None
                else [after, *node_neighbours(after)]
            )
        if before is not None:
            before.prepend(node)
        else:
            after.append(node)
        self.notify("modify", rule, [node], [node])

    def rename(self, node: fx.Node, name: str, *, rule: str) -> None:
        """Give ``node`` the name ``name``, which no node of its graph holds now (an erased
        node's name is released first)."""
        journal = self.journal
        if journal is not None:
            journal.before(node)
        release_name(node.graph, name)
        rename_node(node, name)
        self.notify("modify", rule, [node], [node])

    # ----- erasing ----------------------------------------------------------------------
    def erase(self, node: fx.Node, rule: str, *, location: str | None = None) -> None:
        """Erase a node that has no users."""
        journal = self.journal
        if journal is not None:
            journal.before(node)
        self.notify("erase", rule, [node], (), location)
        node.graph.erase_node(node)

    def erase_all(
        self, nodes: Iterable[fx.Node], rule: str, *, location: str | None = None
    ) -> list[fx.Node]:
        """Erase those of ``nodes`` that nothing outside them uses (users first), in one
        change; returns them."""
        todo = sorted((n for n in nodes if not is_erased(n)), key=sort_key, reverse=True)
        dead: dict[fx.Node, None] = {}
        for n in todo:  # users come later in the graph: decided first
            if n not in dead and all(u in dead for u in n.users):
                dead[n] = None
        if not dead:
            return []
        out = list(dead)
        journal = self.journal
        if journal is not None:
            journal.before(*out)
        self.notify("erase", rule, out, (), location)
        erasers: dict[fx.Graph, Any] = {}
        for n in out:
            graph = n.graph
            if graph not in erasers:
                erasers[graph] = dead_node_eraser(graph) or graph.erase_node
            erasers[graph](n)
        return out


def _read_by(args: Any, kwargs: Any = None) -> list[fx.Node]:
    """The nodes in arguments."""
    out: list[fx.Node] = []
    map_arg((args, kwargs), out.append)
    return out


_NAMES: dict[int, tuple[Any, str]] = {}  # id(target) -> (target, the node name torch gives it)
