"""What a running pass can reach: sample inputs, statistics, the editor, the analyses,
listeners and debug counters.

A pipeline run hands each pass that asks for it (a parameter named ``ctx``, see
:mod:`fxpass.core.contract`) its :class:`PassContext`: the pass reports statistics with
:meth:`PassContext.stat`, edits the graph through :attr:`PassContext.editor` (which asks
:meth:`PassContext.allow` before each change, so bisection can stop after the k-th one —
MLIR's debug counters — and tells :meth:`PassContext.notify` after it), and asks
:attr:`PassContext.analyses` for facts about the graph that survive the passes that
preserve them. For code that is handed nothing — a pass that did not ask, a public helper,
torch calling back — the run also installs the context as the editor's listener (the one
context variable of a run, in :mod:`fxpass.edit.editor`): :func:`current_context`,
:func:`stat` and the analyses' getters read it there.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..edit.editor import ChangeEvent, Editor, active_listener, listening
from .analysis_manager import AnalysisManager
from .report import PassRecord

__all__ = [
    "ChangeEvent",
    "DebugCounter",
    "PassContext",
    "current_context",
    "detached",
    "scoped",
    "stat",
]

T = TypeVar("T")


@dataclass
class DebugCounter:
    """Allow only some actions: skip the first ``skip``, then allow ``count`` (``-1``: all).

    ``DebugCounter(count=k)`` lets exactly the first ``k`` rewrites of a run happen, which is
    what bisection needs; ``seen`` counts every action asked about, allowed or not.
    """

    skip: int = 0
    count: int = -1
    seen: int = 0

    def allow(self) -> bool:
        self.seen += 1
        if self.seen <= self.skip:
            return False
        return self.count < 0 or self.seen <= self.skip + self.count


@dataclass
class _RunState:
    """What a pipeline run keeps for itself (passes and instruments do not use it): the
    records of the passes now running, the deferred recompile, the pipelines whose checks
    apply, installed invariants, the passes that completed, the last fingerprint and the
    suppressed check failures."""

    records: list[PassRecord] = field(default_factory=list)
    recompiler: Any = None
    checks: list[Any] = field(default_factory=list)  # pipelines whose checks apply now
    invariants: list[Any] = field(default_factory=list)  # installed by passes that ran
    ran: list[str] = field(default_factory=list)  # leaf passes that completed, in order
    fp: Any = None  # (module, fingerprint) after the last pass
    suppressed: list[str] = field(default_factory=list)
    snapshot: Any = None  # the rollback snapshot (modules; graphs once a pass needs them)
    journal: Any = None  # the editor's journal of the run (kept when ctx.journal stops)
    snapshots: list[str] = field(default_factory=list)  # passes a graph snapshot was for
    full: bool = False  # checks over the whole graph after every pass (verify_each="full")
    touched: Any = None  # the nodes the last journaled pass changed (None: not known)


def _enabled(name: str) -> bool:
    return True


@dataclass
class PassContext:
    """What the passes and instruments of one pipeline run can reach.

    ``sample_inputs`` (for lowering passes), the ``instruments`` attached, the
    ``debug_counter``, ``actions`` asked about so far, ``pass_path`` (names of the passes
    now running, outermost first), ``enabled(name)`` (whether a pass may run: the
    registry's ``enable``/``disable`` unless the run was given another), the
    :attr:`editor` every change goes through, the :attr:`analyses` of the run's graphs,
    and — for hooks — ``changed`` and ``error``. What the run keeps for itself is private.
    """

    sample_inputs: Sequence[Any] | None = None
    #: the run's :class:`~fxpass.core.Instrumentation` objects, called around every pass
    instruments: list[Any] = field(default_factory=list)
    debug_counter: DebugCounter | None = None
    enabled: Callable[[str], bool] = _enabled
    actions: int = 0
    pass_path: list[str] = field(default_factory=list)
    error: Any = None  # the PassFailedError of a failed run, for after_pipeline hooks
    #: In ``after_pass`` hooks: whether the run of the pass that just returned changed the
    #: graph. ``record.modified`` is whether any of its runs did (it accumulates over a
    #: fixpoint's rounds), so hooks that act on a change read this instead.
    changed: bool = False
    #: The analyses of the run's graphs (see :mod:`fxpass.core.analysis_manager`): computed on
    #: demand, cached per graph, dropped on a change unless the running pass preserves them.
    analyses: AnalysisManager = field(default_factory=AnalysisManager, repr=False)
    #: The editor's journal (:class:`~fxpass.edit.journal.Journal`): the editor tells it
    #: what each change will touch, so that a failed run can undo the changes; None outside a
    #: run and after a pass that edits outside the editor (the run snapshots the graph then).
    journal: Any = field(default=None, repr=False)
    #: The program the run's graph belongs to, handed over by the door that started the run:
    #: for an ExportedProgram's graph, its :class:`~fxpass.targets.export.ProgramContext`
    #: (the weights, which placeholder is which); None for a plain GraphModule.
    program: Any = field(default=None, repr=False)
    #: the run's own bookkeeping (the pipeline's, not the passes')
    _run: _RunState = field(default_factory=_RunState, repr=False, init=False)
    _editor: Editor | None = field(default=None, repr=False, init=False)

    @property
    def editor(self) -> Editor:
        """The editor of this run: every change a pass makes goes through it (it asks the
        debug counter, tells the instrumentation and the analyses, and records provenance
        naming the pass running when the edit is made).

        >>> def drop_clones(gm, ctx):  # a pass asks for its context by name   # doctest: +SKIP
        ...     for node in gm.graph.find_nodes(op="call_function", target=aten.clone.default):
        ...         if ctx.editor.allow():
        ...             ctx.editor.replace_all_uses(node, node.args[0], "drop_clone")
        """
        editor = self._editor
        if editor is None:
            editor = self._editor = Editor(self)
        return editor

    @property
    def record(self) -> PassRecord | None:
        """The record of the innermost pass now running."""
        records = self._run.records
        return records[-1] if records else None

    def stat(self, name: str, value: float = 1) -> None:
        """Add ``value`` to the statistic ``name`` of the pass now running."""
        records = self._run.records
        if records:
            stats = records[-1].stats
            stats[name] = stats.get(name, 0) + value

    def allow(self) -> bool:
        """Ask before making one change; False means skip it (a debug counter said so)."""
        self.actions += 1
        return self.debug_counter is None or self.debug_counter.allow()

    def notify(self, event: ChangeEvent) -> None:
        """Tell the analyses (they drop what the change made stale) and every
        instrumentation about a change."""
        if not event.index:
            event.index = self.actions
        self.analyses.on_change(event)
        for inst in self.instruments:
            inst.on_change(event, self)


def current_context() -> PassContext | None:
    """The context of the pipeline run in progress in this thread, or None (for code that
    was not handed one: a pass asks for it with a parameter named ``ctx``)."""
    ctx = active_listener()
    return ctx if isinstance(ctx, PassContext) else None


@contextlib.contextmanager
def scoped(var: contextvars.ContextVar[T], value: T) -> Iterator[T]:
    """Set the context variable ``var`` to ``value`` for the ``with`` block, then restore it."""
    token = var.set(value)
    try:
        yield value
    finally:
        var.reset(token)


@contextlib.contextmanager
def _activate(ctx: PassContext) -> Iterator[PassContext]:
    """Make ``ctx`` the run in progress for the block: the listener of editors made without
    one, the context :func:`current_context` gives, the manager analyses are asked through."""
    with listening(ctx):
        yield ctx


def detached() -> contextlib.AbstractContextManager[None]:
    """Leave the pipeline run in progress for the ``with`` block: a pipeline run inside it is
    a run of its own (its own rollback, checks and report), not a part of the outer one.
    For code that, from inside a pass, transforms an unrelated graph with a pipeline."""
    return listening(None)


def stat(name: str, value: float = 1) -> None:
    """Count a statistic for the pass now running (no-op outside a pipeline).

    >>> import fxpass as fp
    >>> def drop_clones(gm):
    ...     for node in list(gm.graph.nodes):
    ...         ...
    ...         fp.stat("clones_removed")
    """
    ctx = current_context()
    if ctx is not None:
        ctx.stat(name, value)
