"""Running a pipeline on a TARGET: through :func:`fxpass.apply`, the library's one path."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..fxutil.messages import excerpt, first_line
from ._targets import Target

if TYPE_CHECKING:
    from ..targets.apply import ApplyResult


def parse_pipeline(spec: str | None) -> Any:
    """The pipeline for ``-p SPEC`` (the registered ``default`` when ``-p`` is not given),
    resolved once here and handed down as it is (``apply``, the runner).

    A bad spec raises :class:`~fxpass.core.errors.SpecError`, which ``main`` reports as
    :func:`spec_error_line` with exit code 2; so does an empty one (``-p ""``), which would
    otherwise run nothing, or the default, without saying so."""
    from ..core.errors import SpecError
    from ..core.pipeline import resolve_pipeline

    if spec is not None and not spec.strip():
        raise SpecError(
            "the spec is empty: name the passes (e.g. -p cse,dce), or leave -p out for the "
            "default pipeline",
            spec,
            1,
        )
    return resolve_pipeline(spec)


def spec_error_line(e: Any) -> str:
    """``bad pipeline spec at column C of 'SPEC': what``; a long spec is quoted around the
    column (:func:`~fxpass.fxutil.messages.excerpt`), with its length."""
    message = getattr(e, "message", None) or first_line(e)
    spec, column = getattr(e, "spec", ""), getattr(e, "column", 0)
    shown = excerpt(spec, column)[0]
    length = f" (a {len(spec):,}-character spec)" if shown != spec else ""
    where = f" at column {column} of '{shown}'{length}" if spec else ""
    return f"bad pipeline spec{where}: {message}"


def user_inputs(target: Target) -> list[Any]:
    """The inputs the user's program takes: given, stored, or made from ``meta['val']``
    (worked out once per target)."""
    from ..verify.inputs import sample_args

    if target.inputs is None:
        target.inputs = sample_args(target.program, target.args)[0]
    return list(target.inputs)


def graph_inputs(target: Target) -> list[Any]:
    """One input per placeholder of the target's graph module."""
    from ..verify.inputs import program_inputs

    args = user_inputs(target)
    if target.is_exported:
        return program_inputs(target.program, args, target.kwargs)
    return args


def evaluate(program: Any, target: Target) -> list[Any]:
    """Run ``program`` (the target before or after the passes) on the target's inputs."""
    import torch
    from torch.utils import _pytree as pytree

    from ..verify.numerics import run_graph

    if isinstance(program, torch.export.ExportedProgram):
        args = [x.clone() if isinstance(x, torch.Tensor) else x for x in user_inputs(target)]
        with torch.no_grad():
            return pytree.tree_leaves(program.module()(*args, **target.kwargs))
    return run_graph(program, user_inputs(target))


def evaluate_promoted(program: Any, target: Target) -> Any:
    """``program``'s outputs computed in float32 where it uses bf16/fp16 (or None, or why
    that run failed): the yardstick that tells rounding from wrong rewrites (see
    ``run_graph_promoted``, ``compare_outputs``)."""
    import torch

    from ..verify.compare import ReferenceUnavailable, low_precision, run_graph_promoted

    if isinstance(program, torch.export.ExportedProgram):
        if target.kwargs:
            if not low_precision(program.graph_module):
                return None
            return ReferenceUnavailable("the float32 run takes no keyword inputs")
        program = program.module()
    return run_graph_promoted(program, user_inputs(target))


def apply_pipeline(
    target: Target,
    pipeline: Any,
    instrument: list[Any],
    cache: str | None = None,
    *,
    portable: bool = False,
) -> ApplyResult:
    """Run ``pipeline`` on the target through ``fxpass.apply`` (same kind in, same kind out);
    ``cache`` is a pipeline cache folder (``--cache``); ``portable``: then lower fxpass's ops
    to torch's own."""
    from ..targets.apply import apply

    return apply(
        target.program,
        pipeline,
        target.args,
        instrument=instrument,
        cache=cache,
        portable=portable,
    )
