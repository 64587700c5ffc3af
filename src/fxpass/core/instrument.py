"""Instrumentation: hooks around pipelines, passes, failures and single changes (MLIR style).

Subclass :class:`Instrumentation` and override the hooks you need, then give instances to a
run: ``pipeline(gm, instrument=[PrintIR(after_change=True), Timing()])``. Built in:

* :class:`PrintIR` — the graph before / after each pass, only after a change, after a failure;
* :class:`Timing` — the nested per-pass timing tree, printed when the run ends;
* :class:`Statistics` — the statistics passes declared and counted;
* :class:`~fxpass.core.reproducer.CrashReproducer` — a folder that reproduces a failure.

Every run also returns a :class:`~fxpass.core.report.Report`; these hooks are for watching a
run as it happens and for side effects such as files.
"""

from __future__ import annotations

import sys
from collections.abc import Collection
from typing import Any, TextIO

from rich.console import Console
from rich.tree import Tree
from torch import fx

from .context import ChangeEvent, PassContext
from .report import PassRecord, Report

__all__ = ["Instrumentation", "PrintIR", "Statistics", "Timing", "graph_text"]


class Instrumentation:
    """Base class: every hook does nothing until overridden."""

    def before_pipeline(self, pipeline: Any, gm: fx.GraphModule, ctx: PassContext) -> None:
        """Called when the outermost pipeline starts."""

    def after_pipeline(
        self, pipeline: Any, gm: fx.GraphModule, report: Report, ctx: PassContext
    ) -> None:
        """Called when the outermost pipeline ends, also after a failure (then ``report.error``
        is set and ``gm`` has already been restored to its state before the run)."""

    def before_pass(self, record: PassRecord, gm: fx.GraphModule, ctx: PassContext) -> None:
        """Called before each pass (nested pipelines included)."""

    def after_pass(self, record: PassRecord, gm: fx.GraphModule, ctx: PassContext) -> None:
        """Called after each pass that returned; ``ctx.changed`` says if this run changed
        ``gm`` (``record.modified``: if any of its runs did, e.g. in a fixpoint)."""

    def on_failure(
        self, record: PassRecord, gm: fx.GraphModule, error: BaseException, ctx: PassContext
    ) -> None:
        """Called when a pass raises or a check fails, with ``gm`` as the pass left it."""

    def on_change(self, event: ChangeEvent, ctx: PassContext) -> None:
        """Called for every change made through the rewriter."""


def graph_text(gm: fx.GraphModule, style: str = "code") -> str:
    """The graph as Python code (generated now, not the possibly stale ``gm.code``) or as IR."""
    if style == "graph":
        return str(gm.graph)
    return gm.graph.python_code(root_module="self").src.strip("\n")


def _label(record: PassRecord) -> str:
    """The pass as the user wrote it: its spec, or its name when the spec is an import path."""
    spec = record.spec or record.name
    return record.name if ":" in spec.split("{", 1)[0] else spec


class PrintIR(Instrumentation):
    """Print the graph around passes, like MLIR's ``-mlir-print-ir-*`` flags.

    ``passes`` limits printing to passes with these names; ``style`` is ``"code"`` (the
    Python that would run) or ``"graph"`` (FX's node listing).
    """

    def __init__(
        self,
        *,
        before: bool = False,
        after: bool = False,
        after_change: bool = False,
        after_failure: bool = False,
        passes: Collection[str] | None = None,
        style: str = "code",
        stream: TextIO | None = None,
    ) -> None:
        if style not in ("code", "graph"):
            raise ValueError(f"PrintIR style must be 'code' or 'graph', not {style!r}")
        self.before, self.after = before, after
        self.after_change, self.after_failure = after_change, after_failure
        self.passes = set(passes) if passes is not None else None
        self.style = style
        self.stream = stream

    def _wanted(self, record: PassRecord) -> bool:
        return not record.children and (self.passes is None or record.name in self.passes)

    def _print(self, title: str, gm: fx.GraphModule) -> None:
        out = self.stream or sys.stderr
        out.write(f"// ----- {title} -----\n{graph_text(gm, self.style)}\n\n")

    def before_pass(self, record, gm, ctx):
        if self.before and self._wanted(record):
            self._print(f"IR before {_label(record)}", gm)

    def after_pass(self, record, gm, ctx):
        if not self._wanted(record):
            return
        if self.after or (self.after_change and ctx.changed):
            self._print(f"IR after {_label(record)}", gm)

    def on_failure(self, record, gm, error, ctx):
        if self.after_failure and (self.passes is None or record.name in self.passes):
            self._print(f"IR after failure of {_label(record)}: {error}", gm)


class Timing(Instrumentation):
    """Print the nested timing tree of the run when it ends (MLIR's ``-mlir-timing``)."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream

    def after_pipeline(self, pipeline, gm, report, ctx):
        total = report.root.seconds or 1e-12

        def label(rec: PassRecord) -> str:
            runs = f" x{rec.runs}" if rec.runs > 1 else ""
            return (
                f"{rec.seconds * 1e3:9.3f} ms ({100 * rec.seconds / total:5.1f}%)  {rec.name}{runs}"
            )

        tree = Tree(label(report.root))

        def add(node: Tree, rec: PassRecord) -> None:
            for child in rec.children:
                add(node.add(label(child)), child)

        add(tree, report.root)
        console = Console(file=self.stream or sys.stderr, color_system=None, width=120)
        console.print("Execution time report", tree)


class Statistics(Instrumentation):
    """Print each pass's statistics when the run ends (MLIR's ``-mlir-pass-statistics``)."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream

    def after_pipeline(self, pipeline, gm, report, ctx):
        out = self.stream or sys.stderr
        out.write("Pass statistics report\n")
        for depth, rec in report.root.walk():
            if depth and rec.stats:
                out.write(f"{'  ' * depth}{rec.name}\n")
                for key, value in rec.stats.items():
                    out.write(f"{'  ' * depth}  ({key}) {value:g}\n")
