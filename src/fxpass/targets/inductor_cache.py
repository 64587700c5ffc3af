"""The backend's passes inside Inductor, and their reports when Inductor's cache hits.

The backend installs one :class:`~fxpass.targets.inductor.InductorPass` per pipeline at its
Inductor hook (chained after whatever is installed there). When Inductor's FX graph cache
or AOTAutograd's cache serves a graph, the compile skips the passes entirely — correct, the
cached graph is the one they produced — but then no report would say so.
:class:`InductorReports` records the reports of the compile that ran the passes (forward
and, when it compiles later, backward) under a key of the graph and of the installed
passes' uuids, in Inductor's cache folder; a compile that runs none of the passes is a
cache hit, and gets those reports back, marked ``cached``.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import fx

from ..core.cache import ReportStore, metadata_only
from ..core.identity import UnhashableGraph, graph_hash
from ..core.ranges import Ranges, format_ranges
from ..core.report import PassRecord, Report
from ..core.trace import run_label, trace_cached, tracing
from .inductor import InductorPass
from .runner import Runner

__all__ = ["CACHED_BY", "InductorReports"]

#: What ``report.cached`` says when Inductor's cache served the graph.
CACHED_BY = "Inductor's cache"


class _Recording:
    """The reports of one compile's passes, saved as they come (the backward graph compiles
    at the first backward, after the compile returned)."""

    def __init__(self, store: ReportStore | None) -> None:
        self.store = store
        self.key: str | None = None
        self.reports: list[Report] = []

    def add(self, report: Report) -> None:
        self.reports.append(report)
        if self.store is not None and self.key is not None:
            self.store.save(self.key, self.reports)


class InductorReports:
    """Installs the backend's pipelines at Inductor's hooks and accounts for cache hits."""

    def __init__(self, reports: list[Report], store: ReportStore | None = None) -> None:
        self.reports = reports
        self._store = store

    @property
    def store(self) -> ReportStore:
        if self._store is None:
            from torch._inductor.runtime.cache_dir_utils import cache_dir

            self._store = ReportStore(f"{cache_dir()}/fxpass/reports")
        return self._store

    def install(
        self,
        patches: dict[str, Any],
        runners: Mapping[str, Sequence[Runner]],
        ranges: Ranges | None,
    ) -> list[InductorPass]:
        """Put a pass per runner at its hook in ``patches`` (after what is there);
        returns what is installed at each hook used."""
        from torch._inductor import config

        self._recording = _Recording(self.store)
        installed = []
        for hook, at_hook in runners.items():
            if not at_hook:
                continue
            ours = [
                InductorPass(runner=r, ranges=ranges, on_report=self._recording.add)
                for r in at_hook
            ]
            existing = patches.get(hook, getattr(config, hook))
            before = list(existing) if isinstance(existing, (list, tuple)) else [existing]
            before = [p for p in before if p is not None] + ours[:-1]
            chained = ours[-1].chain(before) if before else ours[-1]
            patches[hook] = chained
            installed.append(chained)
        return installed

    @contextlib.contextmanager
    def compiling(
        self,
        gm: fx.GraphModule,
        inputs: Sequence[Any],
        installed: Sequence[InductorPass],
        ranges: Ranges | None,
        placed: Sequence[tuple[Runner, str]],
    ) -> Iterator[None]:
        """Around one Inductor compile of ``gm`` with ``installed`` at the hooks."""
        recording = self._recording
        recording.key = _key(gm, inputs, installed, ranges)
        yield
        if recording.reports:  # the passes ran: their reports are recorded
            return
        stored = self.store.load(recording.key) if recording.key is not None else None
        for report in stored or [_unrecorded(runner, hook, ranges) for runner, hook in placed]:
            report.cached = CACHED_BY
            if tracing():
                trace_cached(run_label(report.where.get("pipeline", ""), report.where), report)
            self.reports.append(report)


def _key(
    gm: fx.GraphModule, inputs: Sequence[Any], installed: Sequence[InductorPass], ranges: Any
) -> str | None:
    uuids = [p.uuid() for p in installed]
    if any(u is None for u in uuids):
        return None  # Inductor cannot cache these graphs: there are no hits to report
    try:
        graph = graph_hash(gm, metadata_only(inputs))
    except UnhashableGraph:
        return None
    parts = [
        "fxpass-inductor-reports 1",
        graph,
        *uuids,
        f"grad {torch.is_grad_enabled()}",
        f"range {format_ranges(ranges) if ranges else '-'}",
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _unrecorded(runner: Runner, hook: str, ranges: Ranges | None) -> Report:
    """A report for passes Inductor's cache skipped when no report of theirs was recorded
    (the cache was filled by another program, or its reports were deleted)."""
    root = PassRecord(name=runner.pipeline.name, spec=str(runner.pipeline))
    root.notes.append(
        "Inductor served this graph from its cache, so the passes did not run; the report "
        "of the run that filled the cache was not recorded"
    )
    where = dict(runner.where)
    if ranges:
        where["range"] = format_ranges(ranges)
    return Report(root=root, where=where)
