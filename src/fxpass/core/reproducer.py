"""Crash reproducers: when a pass fails, write what it takes to make it fail again.

Attach :class:`CrashReproducer` to a run (``pipeline.run(gm, instrument=[CrashReproducer()])``
or ``fxpass run ... --reproducer DIR``). When a pass raises or a check fails, it writes a
folder with

* ``input.fxgraph`` — the graph as the pipeline received it (after the rollback, so exactly the
  input), with the sample inputs; see :mod:`fxpass.core.serialize`;
* ``pipeline.txt`` — the pipeline spec;
* ``error.txt`` — the error and its traceback;
* ``README.txt`` — the one command that reproduces the failure:
  ``python -m fxpass repro <folder>``.

and adds that command to the :class:`~fxpass.PassFailedError` message. Passes named in the
spec must be registered (or importable as ``module:function``) where the command runs.
"""

from __future__ import annotations

import os
import shlex
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from .contract import FunctionPass, PassResult
from .errors import FxpassError
from .instrument import Instrumentation
from .serialize import load_graph, save_graph

__all__ = ["CrashReproducer", "load_reproducer", "run_reproducer"]


def _unnamed_passes(pipeline: Any) -> list[str]:
    """Passes whose spec text cannot be parsed back (lambdas, local functions)."""
    out = []
    for p in getattr(pipeline, "passes", ()):
        if isinstance(p, FunctionPass) and ":" not in p.spec and not _registered(p.spec):
            out.append(p.name)
        out.extend(_unnamed_passes(p) if hasattr(p, "passes") else ())
    return out


def _registered(name: str) -> bool:
    from .registry import REGISTRY

    return name in REGISTRY


class CrashReproducer(Instrumentation):
    """Write a reproducer folder under ``folder`` when a run fails (MLIR's crash reproducer)."""

    def __init__(self, folder: str | os.PathLike = "fxpass-reproducers") -> None:
        self.folder = Path(folder)
        self.written: list[Path] = []

    def after_pipeline(self, pipeline, gm, report, ctx):
        error = ctx.error
        if error is None:
            return
        stamp = time.strftime("%Y%m%d-%H%M%S")
        name = "".join(c if c.isalnum() or c in "-_" else "_" for c in error.pass_name)
        target = self.folder / f"{stamp}-{name}"
        n = 1
        while target.exists():
            n += 1
            target = self.folder / f"{stamp}-{name}-{n}"
        try:
            self._write(target, pipeline, gm, ctx, error)
        except Exception as e:  # the original failure matters more than the reproducer's
            error.args = (f"{error.args[0]}\n  (no reproducer written: {type(e).__name__}: {e})",)
            return
        self.written.append(target)
        command = f"{shlex.quote(sys.executable)} -m fxpass repro {shlex.quote(str(target))}"
        error.with_reproducer(command)

    def _write(self, target: Path, pipeline, gm, ctx, error) -> None:
        tmp = target.with_name(f".{target.name}.partial")
        tmp.mkdir(parents=True)
        save_graph(gm, tmp / "input.fxgraph", ctx.sample_inputs)
        spec = str(pipeline)
        (tmp / "pipeline.txt").write_text(spec + "\n")
        cause = error.__cause__ or error.cause
        tb = "".join(traceback.format_exception(type(cause), cause, cause.__traceback__))
        (tmp / "error.txt").write_text(f"{str(error).splitlines()[0]}\n\n{tb}")
        unnamed = _unnamed_passes(pipeline)
        warning = (
            f"\nwarning: these passes have no name a spec can use (register them, or define "
            f"them at module level): {', '.join(unnamed)}\n"
            if unnamed
            else ""
        )
        (tmp / "README.txt").write_text(
            f"fxpass crash reproducer\n\npass '{error.pass_name}' failed:\n  "
            f"{str(error).splitlines()[0]}\n\nreproduce with:\n  python -m fxpass repro "
            f"{target}\n{warning}"
        )
        tmp.rename(target)


def load_reproducer(folder: str | os.PathLike):
    """``(graph_module, sample_inputs, pipeline)`` from a reproducer folder."""
    from .pipeline import Pipeline

    folder = Path(folder)
    if not (folder / "pipeline.txt").is_file() or not (folder / "input.fxgraph").is_file():
        raise FxpassError(
            f"{folder} is not an fxpass reproducer folder (it needs pipeline.txt and input.fxgraph)"
        )
    gm, inputs = load_graph(folder / "input.fxgraph")
    cwd = str(Path.cwd())
    if cwd not in sys.path:  # passes named module:function resolve from where the user runs
        sys.path.insert(0, cwd)
    pipeline = Pipeline.parse((folder / "pipeline.txt").read_text().strip())
    return gm, inputs, pipeline


def run_reproducer(folder: str | os.PathLike) -> PassResult:
    """Run a reproducer: raises the same :class:`~fxpass.PassFailedError` as the original run."""
    gm, inputs, pipeline = load_reproducer(folder)
    return pipeline.run(gm, inputs)
