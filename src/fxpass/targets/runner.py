"""The one runner behind every target: ``apply``, the backend, the Inductor pass, piecewise.

A :class:`Runner` runs the pipeline its target resolved (once, where the user handed it
over; None is the registered ``default`` pipeline, read again at every run) with the
target's instruments attached, and keeps the report of every run in ``reports``. It also does what every door
shares: it restores results from a pipeline cache instead of running the passes (and
keeps them there), labels each report with where it ran (``report.where``: the pipeline's
name, the hook, the compile range), and writes each run's artifacts to torch's structured
log while ``TORCH_TRACE`` is on. :func:`graph_sample_inputs`
derives sample inputs from a graph's placeholders. The targets keep only how they plug into
torch (Dynamo, AOTAutograd, Inductor's hooks, ExportedProgram signatures, split modules).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from torch import fx

from ..core.cache import CacheMiss, PipelineCache
from ..core.context import DebugCounter
from ..core.contract import PassResult
from ..core.pipeline import Pipeline, resolve_pipeline
from ..core.ranges import current_range, format_ranges
from ..core.report import Report
from ..core.trace import StructuredTrace, run_label, trace_cached, tracing

__all__ = ["Runner", "as_cache", "graph_sample_inputs"]


class Runner:
    """Runs ``pipeline`` for a target with ``instrument`` attached; collects ``reports``.

    ``pipeline`` is a :class:`~fxpass.Pipeline` the target resolved
    (:func:`~fxpass.core.pipeline.resolve_pipeline`), or None: the ``default`` pipeline as
    it stands at each run. Runners made
    with ``reports=`` share that list (a backend's runs, whatever path they take).
    ``cache`` (a :class:`~fxpass.core.cache.PipelineCache` or its folder) restores results
    instead of running the passes; ``where`` labels every report (``{"pipeline": "fusion",
    "hook": "post_grad_custom_post_pass"}``).
    """

    def __init__(
        self,
        pipeline: Any = None,
        *,
        instrument: Iterable[Any] = (),
        reports: list[Report] | None = None,
        cache: PipelineCache | str | os.PathLike | None = None,
        where: Mapping[str, str] | None = None,
    ) -> None:
        if pipeline is not None and not isinstance(pipeline, Pipeline):
            raise TypeError(
                f"Runner runs a resolved Pipeline (or None, the default), not "
                f"{type(pipeline).__name__}: resolve it where the target receives it, "
                "with fxpass.core.pipeline.resolve_pipeline"
            )
        self.given = pipeline
        self.instrument = tuple(instrument)
        self.reports: list[Report] = [] if reports is None else reports
        self.cache = as_cache(cache)
        self.where = dict(where or {})

    @property
    def pipeline(self) -> Pipeline:
        """The pipeline the next run uses."""
        return resolve_pipeline(None) if self.given is None else self.given

    def run(
        self,
        gm: fx.GraphModule,
        sample_inputs: Sequence[Any] | None = None,
        *,
        debug_counter: DebugCounter | None = None,
        key_inputs: Sequence[Any] | None = None,
        where: Mapping[str, str] | None = None,
        program: Any = None,
    ) -> PassResult:
        """Run the pipeline on ``gm`` (or restore its cached result) and keep its report.

        ``key_inputs`` stand for ``sample_inputs`` in the cache key (a target passes
        metadata-only stand-ins for inputs whose values cannot matter); ``where`` adds to
        the report's labels for this run (e.g. ``{"graph": "backward"}``); ``program`` is
        what the graph belongs to (``PassContext.program``)."""
        pipeline = self.pipeline
        where = {**self._where(pipeline), **(where or {})}
        inputs = sample_inputs if key_inputs is None else key_inputs
        key, miss, hit = self._lookup(pipeline, gm, inputs, debug_counter)
        if hit is not None:
            return self._cached(gm, *hit, where)
        instruments = list(self.instrument)
        if tracing():
            instruments.append(StructuredTrace(run_label(where.get("pipeline", ""), where)))
        result = pipeline.run(
            gm, sample_inputs, instrument=instruments, debug_counter=debug_counter,
            program=program,
        )  # fmt: skip
        report = result.report
        if report is not None:
            report.where.update(where)
            if key is not None:  # stored before this run's notes about the cache
                problem = self.cache.store(key, result.graph_module, report, result.modified)
                if problem:
                    report.root.notes.append(problem)
            if miss.reason:
                report.root.notes.append(miss.reason)
            self.reports.append(report)
        return result

    def _lookup(self, pipeline: Pipeline, gm: fx.GraphModule, inputs: Any, debug_counter: Any):
        """(the key to keep the result under or None, why the cache gave nothing, what it
        gave or None)."""
        if self.cache is None or debug_counter is not None:  # a bisection must run the passes
            return None, CacheMiss(""), None
        key = self.cache.key(pipeline, gm, inputs, ranges=current_range())
        if isinstance(key, CacheMiss):
            return None, key, None
        if self.instrument:  # they watch the passes run; the result is kept for later runs
            return key, CacheMiss("not restored from the cache: instruments are attached"), None
        hit = self.cache.restore(key, gm)
        if isinstance(hit, CacheMiss):
            return key, hit, None
        return key, CacheMiss(""), hit

    def _where(self, pipeline: Pipeline) -> dict[str, str]:
        where = dict(self.where)
        if pipeline.name != Pipeline.name:  # named: say which
            where.setdefault("pipeline", pipeline.name)
        ranges = current_range()
        if ranges:
            where["range"] = format_ranges(ranges)
        return where

    def _cached(self, gm: fx.GraphModule, report: Report, modified: bool, where) -> PassResult:
        report.where.update(where)
        if tracing():
            trace_cached(run_label(where.get("pipeline", ""), where), report)
        self.reports.append(report)
        return PassResult(gm, modified, report.stats(), report=report)


def as_cache(cache: Any) -> PipelineCache | None:
    """A :class:`~fxpass.core.cache.PipelineCache` from a cache or its folder (None: none)."""
    if cache is None or isinstance(cache, PipelineCache):
        return cache
    if isinstance(cache, (str, os.PathLike)):
        return PipelineCache(cache)
    raise TypeError(f"cache is a folder or a fxpass.core.cache.PipelineCache, not {cache!r}")


def graph_sample_inputs(gm: fx.GraphModule) -> list[Any] | None:
    """One (fake) value per placeholder from its ``meta["val"]`` (or Dynamo's
    ``example_value``); None when a placeholder has neither."""
    vals = []
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        val = node.meta.get("val", node.meta.get("example_value"))
        if val is None:
            return None
        vals.append(val)
    return vals
