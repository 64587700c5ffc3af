"""The one runner behind every target: ``apply``, the backend, the Inductor pass, piecewise.

A :class:`Runner` resolves the pipeline a target was given (once; None is the registered
``default`` pipeline, read again at every run), runs it with the target's instruments
attached, and keeps the report of every run in ``reports``. :func:`graph_sample_inputs`
derives sample inputs from a graph's placeholders. The targets keep only how they plug into
torch (Dynamo, AOTAutograd, Inductor's hooks, ExportedProgram signatures, split modules).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from torch import fx

from ..core.context import DebugCounter
from ..core.contract import PassResult
from ..core.pipeline import Pipeline
from ..core.report import Report
from ..core.spec import resolve_pipeline

__all__ = ["Runner", "graph_sample_inputs", "resolve_pipeline"]


class Runner:
    """Runs ``pipeline`` for a target with ``instrument`` attached; collects ``reports``.

    ``pipeline`` is anything :func:`resolve_pipeline` takes; it is resolved on first use
    and kept, except None (the ``default`` pipeline as it stands at each run). Runners made
    with ``reports=`` share that list (a backend's runs, whatever path they take).
    """

    def __init__(
        self,
        pipeline: Any = None,
        *,
        instrument: Iterable[Any] = (),
        reports: list[Report] | None = None,
    ) -> None:
        self.given = pipeline
        self.instrument = tuple(instrument)
        self.reports: list[Report] = [] if reports is None else reports
        self._pipeline: Pipeline | None = None

    @property
    def pipeline(self) -> Pipeline:
        """The pipeline the next run uses."""
        if self.given is None:
            return resolve_pipeline(None)
        if self._pipeline is None:
            self._pipeline = resolve_pipeline(self.given)
        return self._pipeline

    def run(
        self,
        gm: fx.GraphModule,
        sample_inputs: Sequence[Any] | None = None,
        *,
        debug_counter: DebugCounter | None = None,
    ) -> PassResult:
        """Run the pipeline on ``gm`` and keep its report."""
        result = self.pipeline.run(
            gm, sample_inputs, instrument=self.instrument, debug_counter=debug_counter
        )
        if result.report is not None:
            self.reports.append(result.report)
        return result


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
