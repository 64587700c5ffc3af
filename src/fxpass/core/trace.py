"""Structured traces: fxpass's part of a ``TORCH_TRACE`` log, beside Dynamo, AOT and Inductor.

``TORCH_TRACE=/tmp/trace python train.py`` makes torch write a structured log of every
compile; ``tlparse`` turns it into a page per compile with each stage's artifacts. Every
pipeline run fxpass makes while the log is on writes its own artifacts through the same
log (``torch._logging.trace_structured``), so they sit in the compile that ran them, in
the order they happened:

==========================================  ======================================================
artifact                                    what
==========================================  ======================================================
``fxpass_<run>_graph_before``               the graph the pipeline was given
``fxpass_<run>_<n>_<pass>``                 one pass's record: changed?, time, nodes, statistics,
                                            notes, numerics (JSON)
``fxpass_<run>_<n>_<pass>_changes``         what the pass changed: a unified diff of the graph
``fxpass_<run>_<pass>_failed``              the error of a pass that failed (JSON)
``fxpass_<run>_report``                     the whole report (JSON): rollbacks, suppressed checks
``fxpass_<run>_graph_after``                the graph the pipeline returned
``fxpass_<run>_cached``                     a result restored from a cache: the recorded report
==========================================  ======================================================

``<run>`` names the pipeline and where it ran (``default``, ``fusion_post_grad_forward``),
``<n>`` counts the passes of the run. Nothing is computed unless the log is on.
"""

from __future__ import annotations

import difflib
import json
import logging
import re
from collections.abc import Mapping
from typing import Any

from torch import fx

from .context import PassContext
from .instrument import Instrumentation, graph_text
from .report import PassRecord, Report

__all__ = ["StructuredTrace", "artifact", "run_label", "tracing"]


def tracing() -> bool:
    """Whether torch's structured log is on (``TORCH_TRACE``, or a handler someone added).

    torch hangs a lazy trace handler with no directory on its trace log in every process; it
    writes nothing outside Meta's own environment and removes itself on the first record.
    That one does not count, or the first run of every process would render graphs for a log
    nobody writes; nor do pytest's log-capture handlers, which pytest hangs on every logger
    that does not propagate (they keep records for test reports, not for tlparse).
    """
    from torch._logging._internal import LazyTraceHandler, trace_log

    def writes_a_trace(handler: logging.Handler) -> bool:
        if isinstance(handler, LazyTraceHandler):
            return handler.root_dir is not None
        return not type(handler).__module__.startswith("_pytest.")

    return any(writes_a_trace(h) for h in trace_log.handlers)


def artifact(name: str, payload: Any, *, json_payload: bool = False) -> None:
    """Write one artifact to the structured log (nothing when it is off)."""
    from torch._logging import trace_structured

    def make_payload() -> str:
        if json_payload:
            return json.dumps(payload, indent=1, default=str)
        return payload() if callable(payload) else str(payload)

    trace_structured(
        "artifact",
        metadata_fn=lambda: {"name": name, "encoding": "json" if json_payload else "string"},
        payload_fn=make_payload,
        expect_trace_id=False,  # fxpass also runs outside torch.compile (apply, the CLI)
    )


_UNSAFE = re.compile(r"[^A-Za-z0-9_]+")


def run_label(name: str, where: Mapping[str, str] | None = None) -> str:
    """``fusion`` + ``{"hook": "post_grad", "graph": "forward"}`` -> ``fusion_post_grad_forward``:
    what names a run's artifacts (letters, digits and ``_`` only: tlparse makes files of them)."""
    parts: list[str] = []
    for part in (name, *(str(v) for k, v in (where or {}).items() if k != "pipeline")):
        if part and part not in parts:  # a pipeline named for its hook says it once
            parts.append(part)
    return _UNSAFE.sub("_", "_".join(parts)).strip("_") or "pipeline"


class StructuredTrace(Instrumentation):
    """Write a run's artifacts to torch's structured log (see the module's table).

    Targets attach it to every run while the log is on; attach it yourself to trace a run
    of your own. ``label`` names the run's artifacts (default: the pipeline's name).
    """

    def __init__(self, label: str | None = None) -> None:
        self.label = label
        self._run = "pipeline"
        self._count = 0
        self._text: str | None = None

    def _name(self, *parts: Any) -> str:
        return "_".join(["fxpass", self._run, *(_UNSAFE.sub("_", str(p)) for p in parts)])

    def before_pipeline(self, pipeline: Any, gm: fx.GraphModule, ctx: PassContext) -> None:
        self._run = self.label or run_label(getattr(pipeline, "name", "pipeline"))
        self._count = 0
        self._text = graph_text(gm)
        artifact(self._name("graph_before"), self._text)

    def after_pass(self, record: PassRecord, gm: fx.GraphModule, ctx: PassContext) -> None:
        if record.children:  # a nested pipeline: its passes wrote their own
            return
        self._count += 1
        n = f"{self._count:02d}"
        info = _record_info(record, ctx)
        artifact(self._name(n, record.name), info, json_payload=True)
        if ctx.changed:
            before, after = self._text or "", graph_text(gm)
            self._text = after
            diff = difflib.unified_diff(
                before.splitlines(), after.splitlines(), "before", "after", lineterm="", n=2
            )
            artifact(self._name(n, record.name, "changes"), "\n".join(diff))

    def on_failure(
        self, record: PassRecord, gm: fx.GraphModule, error: BaseException, ctx: PassContext
    ) -> None:
        info = {
            "pass": record.name,
            "spec": record.spec,
            "error": f"{type(error).__name__}: {error}",
        }
        artifact(self._name(record.name, "failed"), info, json_payload=True)

    def after_pipeline(
        self, pipeline: Any, gm: fx.GraphModule, report: Report, ctx: PassContext
    ) -> None:
        data = report.to_dict()
        if report.error:
            data["rolled_back"] = "the graph was restored to its state before the pipeline"
        artifact(self._name("report"), data, json_payload=True)
        if not report.error and report.modified:
            artifact(self._name("graph_after"), graph_text(gm))
        self._text = None


def _record_info(record: PassRecord, ctx: PassContext) -> dict[str, Any]:
    info: dict[str, Any] = {
        "pass": record.name,
        "spec": record.spec,
        "changed": bool(ctx.changed),
        "run": record.runs,
        "ms": round(record.seconds * 1e3, 3),
        "nodes_before": record.nodes_before,
        "nodes_after": record.nodes_after,
        "stats": dict(record.stats),
    }
    if record.notes:
        info["notes"] = list(record.notes)
    numerics = _numerics(record, ctx)
    if numerics is not None:
        info["numerics"] = numerics
    return info


def _numerics(record: PassRecord, ctx: PassContext) -> Any:
    """What a numerics check attached to the run found after this run of the pass."""
    for inst in ctx.instruments:
        results = getattr(inst, "results", None)
        if not isinstance(results, list) or not results:
            continue
        last = results[-1]
        if getattr(last, "name", None) == record.name and getattr(last, "run", None) == record.runs:
            to_dict = getattr(last, "to_dict", None)
            return to_dict() if callable(to_dict) else str(last)
    return None


def trace_cached(label: str, report: Report) -> None:
    """Say in the log that a run's result came from a cache, with the recorded report."""
    artifact(f"fxpass_{label}_cached", report.to_dict(), json_payload=True)
