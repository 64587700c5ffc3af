"""The self-contained HTML report: pipeline summary, numerics, and pictures of what changed.

>>> import fxpass as fp
>>> from fxpass.html import HtmlReport
>>> pipe.run(gm, instrument=[HtmlReport("report.html")])       # doctest: +SKIP

:class:`HtmlReport` records the changed regions while the pipeline runs
(:class:`GraphRecorder`) and writes the file when the run ends, also when it fails. The
pieces are usable alone: :func:`render_html` builds the document, :func:`write_html` writes it
atomically, :func:`diff_graphs` compares two graphs.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .capture import GraphRecorder, Hunk, PassChange, SubGraph, diff_graphs, summarize
from .lanes import Lanes, render_lanes, stream_lanes
from .render import render_html, write_html

__all__ = [
    "GraphRecorder",
    "HtmlReport",
    "Hunk",
    "Lanes",
    "PassChange",
    "SubGraph",
    "diff_graphs",
    "render_html",
    "render_lanes",
    "stream_lanes",
    "summarize",
    "write_html",
]


class HtmlReport(GraphRecorder):
    """Record a run and write its HTML report to ``path`` when the run ends.

    ``numerics`` is an optional :class:`~fxpass.verify.NumericsCheck` given to the same run,
    whose per-pass results go into the report; ``title`` and ``info`` fill its header.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        title: str = "fxpass report",
        numerics: Any = None,
        info: dict[str, Any] | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(**kw)
        self.path = Path(path)
        self.title = title
        self.numerics = numerics
        self.info = dict(info or {})
        self.written: Path | None = None
        self.lanes: Lanes | None = None

    def after_pipeline(self, pipeline, gm, report, ctx):
        super().after_pipeline(pipeline, gm, report, ctx)
        self.lanes = stream_lanes(gm)
        self.write()

    def write(self, final_numerics: Any = None) -> Path:
        """(Re)write the file, e.g. once more with the final numerics comparison."""
        results: Sequence[Any] = self.numerics.results if self.numerics is not None else ()
        doc = render_html(
            self.report,
            self.changes,
            title=self.title,
            numerics=results,
            final_numerics=final_numerics,
            info=self.info,
            lanes=self.lanes,
        )
        self.written = write_html(self.path, doc)
        return self.written
