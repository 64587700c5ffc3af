"""The one way fxpass changes a graph: ask, edit, tell, record.

Every change a pass makes goes through an :class:`Editor`: it asks the run's debug counter
first (:meth:`Editor.allow`: a counter may say no, which is how bisection stops after the
k-th change), tells the run's instrumentation what changed (:meth:`Editor.notify`), and
gives new nodes the provenance of the nodes they stand for (:meth:`Editor.mark_new`). The
Rewriter, the library passes and ``InterpreterPass`` all edit through it; outside a
pipeline run every change is allowed and nobody is told.

Who listens is an :class:`EditListener`: anything with ``allow()``, ``notify(event)`` and
``pass_path`` (the names of the passes now running). A pipeline run's
:class:`~fxpass.PassContext` is one; while the run is active it is the one :func:`listening`
installed, and ``ctx.editor`` is an editor bound to it. The editor sits below the pass
infrastructure: it knows the listener's shape, not the pipeline.

>>> editor = Editor(pass_name="my_pass")        # doctest: +SKIP
>>> if editor.allow():                          # doctest: +SKIP
...     editor.replace_all_uses(old, new, "my_rule")
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from torch import fx

from .location import caller_location, file_line
from .provenance import COPIED_META, node_sources, provenance_record

__all__ = [
    "ChangeEvent",
    "EditListener",
    "Editor",
    "active_listener",
    "allow",
    "erase",
    "listening",
    "new_node_meta",
    "notify",
    "replace_all_uses",
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


_LISTENER: contextvars.ContextVar[EditListener | None] = contextvars.ContextVar(
    "fxpass_edit_listener", default=None
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


class Editor:
    """Edits on behalf of one pass run (``ctx``: the listener, default the active one;
    ``pass_name``: recorded in new nodes' provenance, default the pass running when the edit
    is made)."""

    __slots__ = ("_name", "ctx")

    def __init__(self, ctx: EditListener | None = _CURRENT, pass_name: str | None = None) -> None:
        self.ctx = _LISTENER.get() if ctx is _CURRENT else ctx
        self._name = pass_name

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
        calling pass's line)."""
        ctx = self.ctx
        if ctx is not None:
            if location is None:
                location = file_line(caller_location())
            ctx.notify(ChangeEvent(kind, rule, list(old), list(new), location=location))

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

    def replace_all_uses(
        self, node: fx.Node, new: fx.Node, rule: str, *, erase_old: bool = True
    ) -> None:
        """Point every user of ``node`` at ``new`` and (by default) erase ``node``; the run
        is told once both are done."""
        node.replace_all_uses_with(new)
        if erase_old and not node.users:
            node.graph.erase_node(node)
        self.notify("replace", rule, [node], [new])

    def erase(self, node: fx.Node, rule: str) -> None:
        """Erase a node that has no users."""
        self.notify("erase", rule, [node])
        node.graph.erase_node(node)

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
        val: Any = _NO_VALUE,
        inherit: bool = True,
    ) -> fx.Node:
        """Create one node right ``before`` or ``after`` an anchor and tell the run.

        ``origin`` names the nodes the new one stands for or serves (a fused op's replaced
        nodes, the matmul whose output a collective reduces, the producer whose event a
        stream op records): they become its ``from_node`` and provenance, and (``inherit``)
        it takes the first one's source metadata. ``val`` sets ``meta['val']``.

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
        with where:
            node = graph.create_node(op, target, tuple(args), dict(kwargs or {}), name=name)
        if val is not _NO_VALUE:
            node.meta["val"] = val
        self.mark_new([node], origin, rule, inherit=inherit)
        self.notify("insert", rule, origin, [node])
        return node

    def set_args(
        self,
        node: fx.Node,
        args: tuple[Any, ...] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        *,
        rule: str,
    ) -> None:
        """Give ``node`` new arguments (``None`` keeps the old ones)."""
        if args is not None:
            node.args = tuple(args)
        if kwargs is not None:
            node.kwargs = dict(kwargs)
        self.notify("modify", rule, [node], [node])

    def replace_input(self, node: fx.Node, old: fx.Node, new: fx.Node, *, rule: str) -> None:
        """Make ``node`` read ``new`` wherever it read ``old``."""
        node.replace_input_with(old, new)
        self.notify("modify", rule, [node, old], [node, new])

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
        if before is not None:
            before.prepend(node)
        else:
            after.append(node)
        self.notify("modify", rule, [node], [node])


def allow() -> bool:
    """:meth:`Editor.allow` for the running pass."""
    return Editor().allow()


def notify(kind: str, rule: str, old: Sequence[fx.Node] = (), new: Sequence[fx.Node] = ()) -> None:
    """:meth:`Editor.notify` for the running pass."""
    Editor().notify(kind, rule, old, new)


def replace_all_uses(node: fx.Node, new: fx.Node, rule: str, *, erase_old: bool = True) -> None:
    """:meth:`Editor.replace_all_uses` for the running pass."""
    Editor().replace_all_uses(node, new, rule, erase_old=erase_old)


def erase(node: fx.Node, rule: str) -> None:
    """:meth:`Editor.erase` for the running pass."""
    Editor().erase(node, rule)


def new_node_meta(new: fx.Node, replaced: Sequence[fx.Node], rule: str, pass_name: str) -> None:
    """:meth:`Editor.mark_new` for one node, recorded under ``pass_name``."""
    Editor(pass_name=pass_name).mark_new([new], replaced, rule)
