"""Analyses: facts about a graph computed on demand, cached, kept while passes preserve them.

MLIR's ``AnalysisManager`` for torch.fx. An analysis is a function of a graph (``positions``:
each node's index; ``aliasing``: who writes which memory) registered with :func:`analysis`.
Inside a pipeline run, ``ctx.analyses.get(positions, gm)`` — or just ``positions(gm)`` —
computes it once and serves it from the cache until the graph changes:

* each change made through the editor (``ctx.editor``) is offered to the cached analyses
  of its graph: one that can absorb it (``update``: positions absorb an erased node,
  aliasing a use replaced by a value of the same memory) stays, the others are dropped
  unless the running pass preserves them;
* after a pass that changed the graph (it said so, or the pipeline's fingerprint saw it: a
  pass that edits without the editor is safe too) every analysis it does not preserve is
  dropped, and an insertion or erasure made without the editor drops them at the next
  request;
* a pass declares what it keeps valid with ``preserves=`` (``@fp.register(...,
  preserves=[positions])``, ``Pass.preserves``) or, while it runs, with
  :meth:`AnalysisManager.preserve` (MLIR's ``markAnalysesPreserved``). Preserving an
  analysis means its cached value is still right after the pass: a pass that changes what
  it describes updates the value in place.

With verification on (``Pipeline(verify_analyses=True)``, or ``FXPASS_VERIFY_ANALYSES=1`` in
the environment) every preserved analysis still cached after a pass that changed the graph is
computed again and compared, and a difference fails the run naming the pass that declared
it. Each pass's record in the report counts the analyses it computed and those it was
served from the cache (``record.analyses``, ``report.analysis_counts()``).

Outside a run there is no cache: ``positions(gm)`` computes.

>>> import fxpass as fp
>>> @fp.analysis("mul_nodes")
... def mul_nodes(graph):
...     return [n for n in graph.nodes if n.target is torch.ops.aten.mul.Tensor]
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from torch import fx

from ..edit.editor import active_listener
from ..fxutil.fx_internals import graph_stamp
from .errors import FxpassError

__all__ = [
    "Analysis",
    "AnalysisManager",
    "PreservedAnalysisError",
    "analysis",
    "get",
    "known_analyses",
    "resolve",
]

VERIFY_ENV = "FXPASS_VERIFY_ANALYSES"


class PreservedAnalysisError(FxpassError, AssertionError):
    """A pass declared an analysis preserved, and computed again it came out different."""


def _default_equal(a: Any, b: Any) -> bool:
    return bool(a == b)


class Analysis:
    """A named analysis: ``compute(graph)`` gives its value for a ``torch.fx.Graph``.

    ``equal(cached, fresh)`` says whether two values agree (verification compares a
    preserved value with a fresh one; the default is ``==``). ``update(value, event)``
    absorbs one change made through the editor (a :class:`~fxpass.core.ChangeEvent`) into the
    value, in place, and returns True — or returns False, and the value is dropped. Calling
    the analysis on a module or graph gets its value through the running pipeline's cache.
    """

    __slots__ = ("compute", "equal", "name", "update")

    def __init__(
        self,
        name: str,
        compute: Callable[[fx.Graph], Any],
        *,
        equal: Callable[[Any, Any], bool] | None = None,
        update: Callable[[Any, Any], bool] | None = None,
    ) -> None:
        self.name = name
        self.compute = compute
        self.equal = equal or _default_equal
        self.update = update

    @property
    def doc(self) -> str:
        """The first paragraph of the analysis function's docstring."""
        return (getattr(self.compute, "__doc__", None) or "").strip().split("\n\n", 1)[0]

    def __call__(self, gm: fx.GraphModule | fx.Graph) -> Any:
        """This analysis of ``gm``: from the running pipeline's cache, else computed now."""
        return get(self, gm)

    def __repr__(self) -> str:
        return f"<analysis {self.name}>"


_REGISTRY: dict[str, Analysis] = {}


def analysis(
    name: str | Callable[[fx.Graph], Any] | None = None,
    *,
    equal: Callable[[Any, Any], bool] | None = None,
    update: Callable[[Any, Any], bool] | None = None,
    replace: bool = False,
) -> Any:
    """Register an analysis: ``@analysis("name")`` on a function of a ``torch.fx.Graph``.

    Returns the :class:`Analysis` (call it on a module or graph to get the value; name it in
    a pass's ``preserves=``). ``equal`` compares two values for verification (default
    ``==``); ``update(value, event) -> bool`` absorbs a change instead of being dropped (see
    :class:`Analysis`). A name is registered once unless ``replace``.
    """
    if callable(name) and not isinstance(name, str):
        return analysis(None, equal=equal, update=update, replace=replace)(name)

    def decorate(fn: Callable[[fx.Graph], Any]) -> Analysis:
        key = name or getattr(fn, "__name__", "")
        if not key or not isinstance(key, str):
            raise TypeError(f"an analysis needs a name: @analysis('name') on {fn!r}")
        old = _REGISTRY.get(key)
        if old is not None and not replace and old.compute is not fn:
            raise ValueError(
                f"an analysis named '{key}' is already registered ({old.compute!r}); "
                "pick another name or pass replace=True"
            )
        made = Analysis(key, fn, equal=equal, update=update)
        _REGISTRY[key] = made
        return made

    return decorate


def resolve(item: Analysis | str) -> Analysis:
    """The :class:`Analysis` for an analysis or its registered name."""
    if isinstance(item, Analysis):
        return item
    if isinstance(item, str):
        found = _REGISTRY.get(item)
        if found is None:
            close = difflib.get_close_matches(item, list(_REGISTRY), n=3, cutoff=0.6)
            hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
            raise KeyError(
                f"no analysis named '{item}'{hint} (registered: {', '.join(sorted(_REGISTRY))})"
            )
        return found
    raise TypeError(
        f"{item!r} is not an analysis: expected an fxpass analysis (made with "
        "fxpass.analysis) or its registered name"
    )


def known_analyses() -> list[str]:
    """Every registered analysis name, sorted."""
    return sorted(_REGISTRY)


def preserved_names(items: Iterable[Analysis | str]) -> frozenset[str]:
    """The names of a pass's ``preserves`` declaration (analyses or their names)."""
    out = []
    for item in items:
        if isinstance(item, Analysis):
            out.append(item.name)
        elif isinstance(item, str):
            out.append(item)
        else:
            raise TypeError(
                f"preserves= takes analyses (made with fxpass.analysis) or their names, "
                f"not {item!r}"
            )
    return frozenset(out)


def _graph_of(gm: Any) -> fx.Graph:
    if isinstance(gm, fx.Graph):
        return gm
    graph = getattr(gm, "graph", None)
    if isinstance(graph, fx.Graph):
        return graph
    raise TypeError(f"analyses are of a torch.fx GraphModule or Graph, not {type(gm).__name__}")


class _Frame:
    """A pass now running: its name, its report record and what it preserves."""

    __slots__ = ("name", "preserved", "record")

    def __init__(self, name: str, preserved: frozenset[str], record: Any) -> None:
        self.name = name
        self.preserved = preserved
        self.record = record


class _Entry:
    """The cached analyses of one graph, what depends on what, and the graph's stamp when
    they were last known right (None: take it at the next request)."""

    __slots__ = ("analyses", "dependents", "stamp", "values")

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self.analyses: dict[str, Analysis] = {}
        self.dependents: dict[str, set[str]] = {}
        self.stamp: Any = None


_OUTSIDE = "(outside passes)"


class AnalysisManager:
    """The analyses of one pipeline run's graphs (``ctx.analyses``).

    ``cache=False`` computes every request (what the library did before it had a manager;
    the benchmark compares the two). ``verify`` checks preserved analyses after each pass
    (default: the ``FXPASS_VERIFY_ANALYSES`` environment variable). ``counts`` maps
    ``(pass, analysis)`` to ``[computed, served from the cache]``.
    """

    def __init__(self, *, cache: bool = True, verify: bool | None = None) -> None:
        self.cache = cache
        self.verify = os.environ.get(VERIFY_ENV, "") not in ("", "0") if verify is None else verify
        self.counts: dict[tuple[str, str], list[int]] = {}
        self._graphs: dict[fx.Graph, _Entry] = {}
        self._frames: list[_Frame] = []
        self._computing: list[str] = []

    # ----- asking -----------------------------------------------------------------------
    def get(self, item: Analysis | str, gm: fx.GraphModule | fx.Graph) -> Any:
        """The analysis of ``gm``'s graph: cached, or computed now (and cached)."""
        a = resolve(item)
        graph = _graph_of(gm)
        entry = self._graphs.get(graph)
        if entry is not None:
            stamp = graph_stamp(graph)
            if entry.stamp is None:
                entry.stamp = stamp
            elif entry.stamp != stamp:  # nodes came or went without the editor
                self._drop(entry, self._preserved())
                entry.stamp = stamp
        if self._computing:
            if entry is None:
                entry = self._entry(graph)
            entry.dependents.setdefault(a.name, set()).add(self._computing[-1])
        if entry is not None and a.name in entry.values:
            self._count(a.name, 1)
            return entry.values[a.name]
        self._computing.append(a.name)
        try:
            value = a.compute(graph)
        finally:
            self._computing.pop()
        self._count(a.name, 0)
        if self.cache:
            entry = entry or self._entry(graph)
            entry.values[a.name] = value
            entry.analyses[a.name] = a
            entry.stamp = graph_stamp(graph)
        return value

    def cached(self, item: Analysis | str, gm: fx.GraphModule | fx.Graph) -> Any:
        """The cached value of the analysis of ``gm``'s graph, or None (never computes)."""
        entry = self._graphs.get(_graph_of(gm))
        return None if entry is None else entry.values.get(resolve(item).name)

    def preserve(self, *items: Analysis | str) -> None:
        """Declare, while a pass runs, that it keeps these analyses valid (MLIR's
        ``markAnalysesPreserved``): changes it makes from now on do not drop them, and
        neither does its end."""
        if self._frames:
            frame = self._frames[-1]
            frame.preserved = frame.preserved | preserved_names(items)

    def invalidate(self, gm: fx.GraphModule | fx.Graph | None = None) -> None:
        """Drop every cached analysis of ``gm``'s graph (of every graph when None)."""
        if gm is None:
            self._graphs.clear()
        else:
            self._graphs.pop(_graph_of(gm), None)

    # ----- being told -------------------------------------------------------------------
    def on_change(self, event: Any) -> None:
        """A change made through the editor: each cached analysis absorbs it (its
        ``update``) or is dropped, unless the running pass preserves it."""
        if not self._graphs:
            return
        nodes = event.new or event.old
        graph = getattr(nodes[0], "graph", None) if nodes else None
        entries = [self._graphs.get(graph)] if graph is not None else list(self._graphs.values())
        preserved = self._preserved()
        for entry in entries:
            if entry is None:
                continue
            keep = set(preserved)
            for name, value in entry.values.items():
                update = entry.analyses[name].update
                if update is not None and update(value, event):
                    keep.add(name)
            self._drop(entry, frozenset(keep))
            entry.stamp = None

    def enter(self, name: str, preserves: Iterable[Analysis | str], record: Any = None) -> Any:
        """A pass starts (the pipeline calls this); returns the frame :meth:`leave` takes."""
        frame = _Frame(name, preserved_names(preserves) if preserves else frozenset(), record)
        self._frames.append(frame)
        return frame

    def leave(self, frame: Any, before: Any, after: Any, changed: bool, *, leaf: bool) -> None:
        """A pass ended (the pipeline calls this): ``before``/``after`` are the modules it
        got and returned. A new module's graph starts with nothing cached; a leaf pass that
        changed the graph drops what it does not preserve."""
        if self._frames and self._frames[-1] is frame:
            self._frames.pop()
        if after is not before:
            self._graphs.pop(_graph_of(before), None)
        elif changed and leaf:
            entry = self._graphs.get(_graph_of(after))
            if entry is not None:
                self._drop(entry, frame.preserved)
                entry.stamp = None

    def check_preserved(self, frame: Any, gm: fx.GraphModule) -> list[str]:
        """Compute each preserved analysis still cached for ``gm`` again and compare: one
        line per analysis the pass of ``frame`` declared preserved that is not."""
        entry = self._graphs.get(_graph_of(gm))
        if entry is None:
            return []
        problems = []
        for name in sorted(frame.preserved & entry.values.keys()):
            a = entry.analyses[name]
            fresh = AnalysisManager(cache=True, verify=False).get(a, gm)  # nothing reused
            cached = entry.values[name]
            if not a.equal(cached, fresh):
                problems.append(
                    f"pass '{frame.name}' declares it preserves analysis '{name}', but "
                    f"computed again after it the analysis differs: {_difference(cached, fresh)}"
                )
        return problems

    # ----- bookkeeping ------------------------------------------------------------------
    def _entry(self, graph: fx.Graph) -> _Entry:
        entry = self._graphs.get(graph)
        if entry is None:
            entry = self._graphs[graph] = _Entry()
        return entry

    def _preserved(self) -> frozenset[str]:
        return self._frames[-1].preserved if self._frames else frozenset()

    def _drop(self, entry: _Entry, keep: frozenset[str]) -> None:
        gone = [name for name in entry.values if name not in keep]
        while gone:
            name = gone.pop()
            entry.values.pop(name, None)
            entry.analyses.pop(name, None)
            for dependent in entry.dependents.pop(name, ()):
                if dependent in entry.values and dependent not in keep:
                    gone.append(dependent)

    def _count(self, name: str, served: int) -> None:
        frame = self._frames[-1] if self._frames else None
        key = (frame.name if frame is not None else _OUTSIDE, name)
        counts = self.counts.get(key)
        if counts is None:
            counts = self.counts[key] = [0, 0]
        counts[served] += 1
        record = frame.record if frame is not None else None
        if record is not None:
            mine = record.analyses.get(name)
            if mine is None:
                mine = record.analyses[name] = [0, 0]
            mine[served] += 1


def _difference(cached: Any, fresh: Any) -> str:
    """Where two analysis values first differ, in words."""
    if isinstance(cached, Mapping) and isinstance(fresh, Mapping):
        for key in cached.keys() | fresh.keys():
            if key not in fresh:
                return f"{_show(key)} is cached but no longer there"
            if key not in cached:
                return f"{_show(key)} is missing from the cached value"
            if cached[key] != fresh[key]:
                return f"at {_show(key)} cached {cached[key]!r}, computed {fresh[key]!r}"
    if isinstance(cached, Sequence) and isinstance(fresh, Sequence):
        if len(cached) != len(fresh):
            return f"cached {len(cached)} items, computed {len(fresh)}"
        for i, (a, b) in enumerate(zip(cached, fresh)):
            if a != b:
                return f"at item {i} cached {a!r}, computed {b!r}"
    return "the values differ"


def _show(key: Any) -> str:
    return f"%{key.name}" if isinstance(key, fx.Node) else repr(key)


def get(item: Analysis | str, gm: fx.GraphModule | fx.Graph) -> Any:
    """The analysis of ``gm``: through the running pipeline's manager, else computed now.

    The run in progress is the editor's listener (its ``PassContext``, whose ``analyses``
    this reads; the context sits above this module). A pass handed its context can ask
    ``ctx.analyses.get(item, gm)`` itself."""
    manager = getattr(active_listener(), "analyses", None)
    if manager is not None:
        return manager.get(item, gm)
    return resolve(item).compute(_graph_of(gm))
