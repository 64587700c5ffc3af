"""``fxpass.apply``: run a pipeline on a GraphModule or an ExportedProgram.

>>> result = fxpass.apply(exported_program, "remove_assert_ops,fixpoint(cse,dce)")  # doctest: +SKIP
>>> result.program            # an ExportedProgram again, its signature kept valid   # doctest: +SKIP
>>> result.modified, result.report                                                   # doctest: +SKIP

The same call takes a GraphModule (edited in place, like :meth:`Pipeline.run`) or an
ExportedProgram (left untouched; the result is a new, validated program — see
:mod:`fxpass.targets.export`). ``pipeline`` is a :class:`~fxpass.Pipeline`, a spec string, a
pass (anything :func:`fxpass.as_pass` takes), a list of passes, or None for the registered
``default`` pipeline.

``portable=True`` ends the run with ``lower_fused_ops``: every ``torch.ops.fxpass`` call the
passes made is replaced by its decomposition into torch's own ops, so the program runs where
fxpass is not installed (``fxpass run --portable``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

from ..core.context import DebugCounter
from ..core.contract import Pass
from ..core.errors import SpecError
from ..core.pipeline import Pipeline
from ..core.report import Report
from .export import run_on_program
from .runner import Runner, resolve_pipeline

__all__ = ["ApplyResult", "apply", "resolve_pipeline"]

_EMPTY_SPEC = (
    "the pipeline spec is empty: name the passes (e.g. 'cse,dce'), or give None for the "
    "registered default pipeline"
)


@dataclass
class ApplyResult:
    """What :func:`apply` returns.

    ``program`` is the same kind as the target (GraphModule or ExportedProgram) after the
    passes; ``graph_module`` is its graph module; ``modified`` says whether any pass changed
    the graph; ``report`` is the run's :class:`~fxpass.Report`.
    """

    program: Any
    graph_module: fx.GraphModule
    modified: bool
    report: Report | None

    def __iter__(self):  # ``program, modified = fxpass.apply(...)`` like a PassResult
        return iter((self.program, self.modified))

    def __repr__(self) -> str:
        return f"ApplyResult(program=<{type(self.program).__name__}>, modified={self.modified})"


def apply(
    target: fx.GraphModule | torch.export.ExportedProgram,
    pipeline: Pipeline | str | Pass | Any = None,
    sample_inputs: Sequence[Any] | None = None,
    *,
    instrument: Iterable[Any] = (),
    debug_counter: DebugCounter | None = None,
    cache: Any = None,
    portable: bool = False,
) -> ApplyResult:
    """Run ``pipeline`` on ``target`` and return an :class:`ApplyResult` of the same kind.

    A GraphModule is transformed in place (restored exactly if a pass fails). An
    ExportedProgram is never edited: the passes run on a copy of its graph and the result
    is a new program whose graph signature, state dict and constants match the new graph
    (the same program when nothing changed). For an ExportedProgram, ``sample_inputs`` are
    its user inputs (default: ``ep.example_inputs``). With ``portable=True`` the result calls
    no ``fxpass::`` op (see the module docstring).

    ``cache`` (a folder or :class:`~fxpass.core.cache.PipelineCache`) restores the result of
    an earlier run on the same graph with the same pipeline without running the passes
    (``result.report.cached`` says so), and keeps this run's result otherwise.
    """
    if isinstance(pipeline, str) and not pipeline.strip():
        raise SpecError(_EMPTY_SPEC, pipeline, 1)
    resolved = resolve_pipeline(pipeline)
    if portable:
        resolved = Pipeline([resolved, "lower_fused_ops"], name=f"{resolved.name}+portable")
    runner = Runner(resolved, instrument=instrument, cache=cache)
    if isinstance(target, torch.export.ExportedProgram):
        program, result = run_on_program(target, runner, sample_inputs, debug_counter=debug_counter)
        return ApplyResult(program, program.graph_module, result.modified, result.report)
    if isinstance(target, fx.GraphModule):
        result = runner.run(target, sample_inputs, debug_counter=debug_counter)
        gm = result.graph_module
        return ApplyResult(gm, gm, result.modified, result.report)
    if isinstance(target, torch.nn.Module):
        raise TypeError(
            f"fxpass.apply takes a GraphModule or an ExportedProgram, got the module "
            f"{type(target).__name__}; capture it first with torch.export.export(model, "
            "inputs), or compile it with torch.compile(model, backend=fxpass.backend(...))"
        )
    raise TypeError(
        "fxpass.apply takes a torch.fx.GraphModule or a torch.export.ExportedProgram, "
        f"got {type(target).__name__}"
    )
