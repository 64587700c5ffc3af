"""The checks a pipeline runs after a pass: lint, user checks, installed invariants, checks
that compare a pass's output with its input, and preserved analyses (when verified).

A check is ``check(gm)``: it raises or returns False when the graph is wrong. A check that
also has ``before_pass(gm, pass) -> state`` and ``after_pass(gm, pass, state, changed)``
sees each leaf pass's input too (``fxpass.verify.keeps_metadata`` is one). A failure is a
:class:`~fxpass.core.CheckFailedError` naming the pass and the check (the run rolls back), or, in
a pipeline that suppresses check failures, a line in the report and a warning.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

from torch import fx

from ..fxutil.fx_internals import lint_nodes
from ..fxutil.messages import first_line
from .analysis_manager import PreservedAnalysisError
from .context import PassContext
from .errors import CheckFailedError
from .report import PassRecord

__all__ = ["Check", "after_leaf", "check_journal", "run_checks", "watch"]

Check = Callable[[fx.GraphModule], Any]


def watch(p: Any, gm: fx.GraphModule, ctx: PassContext) -> list[tuple[Any, Any, Any]]:
    """Call ``before_pass`` of the checks that look at a pass's input; (pipeline, check,
    state) for each."""
    out = []
    for pipe in ctx._run.checks:
        if pipe.run_checks_after_each_pass:
            for check in pipe.checks:
                before = getattr(check, "before_pass", None)
                if before is not None:
                    out.append((pipe, check, before(gm, p)))
    return out


def after_leaf(
    p: Any,
    gm: fx.GraphModule,
    ctx: PassContext,
    record: PassRecord,
    changed: bool,
    watched: Sequence[tuple[Any, Any, Any]] = (),
    frame: Any = None,
):
    """After a pass that is not a pipeline: the checks that apply, the checks that compare
    with the pass's input, the preserved analyses (when verified), then count it as ran."""
    state = ctx._run
    pipelines = state.checks if changed else [c for c in state.checks if c.policy.check_unchanged]
    try:
        if pipelines:
            run_checks(pipelines, gm, ctx, p.name)
        for pipe, check, before in watched:
            name = getattr(check, "__name__", repr(check))
            compare = lambda g, c=check, b=before: c.after_pass(g, p, b, changed)  # noqa: E731
            _run_one(pipe, name, compare, gm, ctx, p.name)
        if changed and frame is not None and ctx.analyses.verify:
            problems = ctx.analyses.check_preserved(frame, gm)
            if problems:
                cause = PreservedAnalysisError("; ".join(problems))
                raise CheckFailedError(p.name, "preserved analyses", state.ran, cause)
    except CheckFailedError as e:
        record.status = "failed"
        record.error = first_line(e)
        for inst in ctx.instruments:
            inst.on_failure(record, gm, e, ctx)
        raise
    state.ran.append(p.name)


def run_checks(pipelines: Sequence[Any], gm: fx.GraphModule, ctx: Any, after: str) -> None:
    """Run the lint and user checks of ``pipelines`` on ``gm`` (after pass ``after``), and
    the invariants passes installed (under the innermost pipeline that runs checks)."""
    state = ctx._run
    active = [pipe for pipe in pipelines if pipe.run_checks_after_each_pass]
    for i, pipe in enumerate(active):
        checks: list[tuple[str, Check]] = []
        if pipe.lint and (after != "(input)" or state.full):
            checks.append(("lint", lambda g: lint(g, state)))
        checks.extend((getattr(c, "__name__", repr(c)), c) for c in pipe.checks)
        if i == len(active) - 1:
            checks.extend((getattr(c, "__name__", repr(c)), c) for c in state.invariants)
        for check_name, check in checks:
            _run_one(pipe, check_name, check, gm, ctx, after)


def check_journal(p: Any, journal: Any, before: Any, ctx: PassContext, record: PassRecord):
    """With the full checks: a pass that declares ``edits="editor"`` changed no node the
    editor's journal did not see (else a failed run could not be undone exactly)."""
    unseen = journal.audit(before)
    if unseen:
        cause = AssertionError(
            f"pass '{p.name}' declares edits='editor' but changed nodes outside the editor: "
            f"{', '.join(unseen[:5])}{' ...' if len(unseen) > 5 else ''}; edit them through "
            "fxpass.edit.Editor, or declare edits='any'"
        )
        record.status = "failed"
        record.error = first_line(cause)
        raise CheckFailedError(p.name, "journal", ctx._run.ran, cause) from cause


def lint(gm: fx.GraphModule, state: Any) -> None:
    """``graph.lint()``: over the whole graph (``verify_each="full"``, or after a pass that
    may edit outside the editor), else over the nodes the pass changed (which include the
    nodes whose arguments, users or neighbours changed): each checked against the nodes it
    reads and the nodes that read it."""
    touched = state.touched
    if state.full or touched is None:
        gm.graph.lint()
        return
    by_graph: dict[Any, list[fx.Node]] = {}
    for n in dict.fromkeys(touched):
        by_graph.setdefault(n.graph, []).append(n)
    for graph, nodes in by_graph.items():
        lint_nodes(graph, iter(nodes))


def _run_one(pipe: Any, name: str, check: Check, gm: fx.GraphModule, ctx: Any, after: str):
    """Run one check of ``pipe`` after pass ``after``: a failure raises
    :class:`CheckFailedError`, or is recorded and warned about when ``pipe`` suppresses."""
    state = ctx._run
    try:
        if check(gm) is False:
            raise AssertionError("the check returned False")
    except Exception as e:
        if not pipe.suppress_check_failures:
            raise CheckFailedError(after, name, state.ran, e) from e
        where = "on the input" if after == "(input)" else f"after pass '{after}'"
        msg = f"check '{name}' failed {where}: {type(e).__name__}: {e}"
        state.suppressed.append(msg)
        warnings.warn(f"fxpass: suppressed {msg}", stacklevel=3)
