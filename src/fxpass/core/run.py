"""Running passes: a group of passes run on one GraphModule with checks and rollback.

This is the engine under every :class:`~fxpass.Pipeline` and under ``pass(gm)`` (a pass run
on its own is a group of one). It knows a pass only by what it calls on it — ``name``,
``spec``, ``execute(gm, ctx)``, ``needs_code``, ``preserves``, ``invariants`` — so it sits
below the pass contract (:mod:`fxpass.core.contract`), which calls it, and below the
pipeline (:mod:`fxpass.core.pipeline`), which adds names, order constraints and text.

What a run guarantees is described in :mod:`fxpass.core.pipeline`.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torch import fx
from torch.fx.passes.infra.pass_base import PassResult as _TorchPassResult

from ..edit.journal import Journal
from ..fxutil.messages import first_line
from .checks import Check, after_leaf, check_journal, run_checks, watch
from .context import DebugCounter, PassContext, _activate, current_context, scoped
from .errors import NestingError, PassFailedError
from .instrument import Instrumentation
from .ranges import range_skip
from .recompile import DeferredRecompile
from .report import PassRecord, Report
from .snapshot import GraphSnapshot, fingerprint, same_fingerprint

__all__ = [
    "DISABLED",
    "MAX_NESTING",
    "VERIFY_EACH_ENV",
    "PassGroup",
    "PassResult",
    "RunPolicy",
    "instrumented",
    "nesting",
    "run_group",
    "run_pass",
]

#: Names of the passes every run skips (reported as skipped): ``fxpass.registry.disable``
#: adds to it (the registry is given this set when it is made).
DISABLED: set[str] = set()


def _enabled(name: str) -> bool:
    return name not in DISABLED


#: The environment variable that sets how much the checks after each pass look at:
#: ``changed`` (the default: the nodes a pass changed through the editor and their
#: neighbours; the whole graph after a pass that edits otherwise) or ``full`` (the whole
#: graph after every pass that changed it, and the input; what the tests use).
VERIFY_EACH_ENV = "FXPASS_VERIFY_EACH"
VERIFY_EACH = ("changed", "full")


def verify_each_mode(value: str | None) -> str:
    """The checks' extent: ``value``, else ``$FXPASS_VERIFY_EACH``, else ``changed``."""
    mode = value or os.environ.get(VERIFY_EACH_ENV) or "changed"
    if mode not in VERIFY_EACH:
        raise ValueError(
            f"verify_each takes {' or '.join(map(repr, VERIFY_EACH))}, got {mode!r} "
            f"(from {'the argument' if value else '$' + VERIFY_EACH_ENV})"
        )
    return mode


_GLOBAL_INSTRUMENTS: contextvars.ContextVar[tuple[Instrumentation, ...]] = contextvars.ContextVar(
    "fxpass_instruments", default=()
)


@contextlib.contextmanager
def instrumented(*instruments: Instrumentation) -> Iterator[None]:
    """Attach instrumentation to every pipeline run inside the block (backends, the CLI).

    >>> with fxpass.core.instrumented(fxpass.core.PrintIR(after_change=True)):   # doctest: +SKIP
    ...     torch.compile(model, backend="fxpass")(x)
    """
    with scoped(_GLOBAL_INSTRUMENTS, (*_GLOBAL_INSTRUMENTS.get(), *instruments)):
        yield


class PassResult(_TorchPassResult):
    """The result of running a pass: ``graph_module``, ``modified``, ``stats`` (and ``report``).

    It is a subclass of torch's ``PassResult`` named tuple, so code that unpacks
    ``gm, modified = result`` or checks ``isinstance(result, torch...PassResult)`` still works.
    """

    def __new__(
        cls,
        graph_module: fx.GraphModule,
        modified: bool,
        stats: Mapping[str, float] | None = None,
        report: Any = None,
    ) -> PassResult:
        self = super().__new__(cls, graph_module, bool(modified))
        self.stats = dict(stats or {})
        self.report = report
        return self

    def __repr__(self) -> str:
        name = type(self.graph_module).__name__
        return f"PassResult(graph_module=<{name}>, modified={self.modified}, stats={self.stats})"


@dataclass(frozen=True)
class RunPolicy:
    """How a pipeline applies its checks and its round limit. fxpass's own runs use the
    defaults; a compatibility layer passes its own (torch's and ExecuTorch's pass managers
    check after unchanged passes too, and treat their round limit as a cap).

    ``check_input``: run the checks on the input before the first pass;
    ``check_unchanged``: run them after passes that changed nothing too;
    ``warn_at_limit``: note and warn when a fixpoint stops at ``max_iterations`` while
    still changing the graph.
    """

    check_input: bool = True
    check_unchanged: bool = False
    warn_at_limit: bool = True


DEFAULT_POLICY = RunPolicy()


#: How many levels of groups may nest inside a group: ``fixpoint(fixpoint(cse))`` nests 2.
#: Real pipelines nest two or three; the limit keeps every walk over a pipeline (running it,
#: printing it, its report, its cache key) far from Python's recursion limit, and a deeper
#: one is a :class:`~fxpass.core.errors.NestingError` (in a spec, a ``SpecError``).
MAX_NESTING = 32


def nesting(group: Any) -> int:
    """How many levels of groups nest inside ``group`` (0 for a group of plain passes),
    counted without recursion; a count over :data:`MAX_NESTING` stops at
    ``MAX_NESTING + 1`` (so a group that holds itself is counted too)."""
    deepest = 0
    best: dict[int, int] = {}
    stack = [(group, 0)]
    while stack:
        g, depth = stack.pop()
        deepest = max(deepest, depth)
        if depth > MAX_NESTING:
            return depth
        for p in g._passes:
            if isinstance(p, PassGroup) and best.get(id(p), -1) < depth + 1:
                best[id(p)] = depth + 1
                stack.append((p, depth + 1))
    return deepest


def check_nesting(group: Any) -> None:
    """Raise :class:`~fxpass.core.errors.NestingError` when ``group`` nests deeper than
    :data:`MAX_NESTING`."""
    if nesting(group) > MAX_NESTING:
        raise NestingError(
            f"{group.name} nests groups of passes more than {MAX_NESTING} levels deep "
            f"(fixpoint(fixpoint(cse)) nests 2), deeper than fxpass runs them: flatten it"
        )


class PassGroup:
    """Passes (already :class:`~fxpass.Pass` objects) run in order on one GraphModule as one
    run, with the group's checks; a :class:`~fxpass.Pipeline` is a group that also reads
    names, order constraints and text. See :class:`~fxpass.Pipeline` for the arguments.
    """

    name = "pipeline"

    def __init__(
        self,
        passes: Iterable[Any] = (),
        *,
        name: str | None = None,
        checks: Iterable[Check] = (),
        lint: bool = True,
        run_checks_after_each_pass: bool = True,
        suppress_check_failures: bool = False,
        instrument: Iterable[Instrumentation] = (),
        policy: RunPolicy = DEFAULT_POLICY,
        verify_analyses: bool | None = None,
        verify_each: str | None = None,
    ) -> None:
        self._passes: list[Any] = list(passes)
        if verify_each is not None:
            verify_each_mode(verify_each)
        self.verify_each = verify_each
        self.policy = policy
        self.verify_analyses = verify_analyses
        if name:
            self.name = name
        self.checks: list[Check] = list(checks)
        self.lint = lint
        self.run_checks_after_each_pass = run_checks_after_each_pass
        self.suppress_check_failures = suppress_check_failures
        self.instrument: list[Instrumentation] = list(instrument)
        check_nesting(self)

    @property
    def passes(self) -> list[Any]:
        """The passes in the order they will run."""
        return list(self._passes)

    def set_passes(self, passes: Iterable[Any]) -> None:
        """Replace the passes (already pass objects), e.g. with required passes inserted."""
        passes, self._passes = self._passes, list(passes)
        try:
            check_nesting(self)
        except NestingError:
            self._passes = passes
            raise

    def add_checks(self, *checks: Check) -> PassGroup:
        """Run ``checks`` after every pass that changes the graph (ExecuTorch's add_checks)."""
        self.checks.extend(checks)
        return self

    @property
    def head(self) -> str:
        """How the group is written around its nested passes: ``pipeline``, ``fixpoint{...}``."""
        return "pipeline"

    @property
    def body_spec(self) -> str:
        """The passes as a spec, without this group's own name around them."""
        return ",".join(p.spec for p in self.passes)

    def __str__(self) -> str:
        return getattr(self, "written_as", None) or self.body_spec

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self)!r})"

    def __len__(self) -> int:
        return len(self._passes)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.passes)

    def __call__(self, gm: fx.GraphModule, sample_inputs: Sequence[Any] | None = None, **kw):
        return self.run(gm, sample_inputs, **kw)

    def run(
        self,
        gm: fx.GraphModule,
        sample_inputs: Sequence[Any] | None = None,
        *,
        instrument: Iterable[Instrumentation] = (),
        debug_counter: DebugCounter | None = None,
        program: Any = None,
    ) -> PassResult:
        """Run the passes on ``gm``; returns a :class:`PassResult` with a ``report``.

        ``sample_inputs`` reach lowering passes ``(gm, sample_inputs)``; ``debug_counter``
        limits how many rewrites the run may make (see :class:`~fxpass.core.DebugCounter`);
        ``program`` is what the graph belongs to (``PassContext.program``).
        """
        return run_group(
            self,
            gm,
            sample_inputs,
            instrument=instrument,
            debug_counter=debug_counter,
            program=program,
        )

    def execute(self, gm: fx.GraphModule, ctx: Any) -> Any:
        new_gm, modified = self._run_nested(gm, ctx, ctx.record)
        return PassResult(new_gm, modified)

    def _run_nested(self, gm, ctx, record: PassRecord | None) -> tuple[fx.GraphModule, bool]:
        checks = ctx._run.checks
        checks.append(self)
        try:
            return self._run_body(gm, ctx, record)
        finally:
            checks.pop()

    def _run_body(self, gm, ctx, record):
        modified = False
        for p in self.passes:
            gm, changed = run_pass(p, gm, ctx, record)
            modified |= changed
        return gm, modified


def run_group(
    group: PassGroup,
    gm: fx.GraphModule,
    sample_inputs: Sequence[Any] | None = None,
    *,
    instrument: Iterable[Instrumentation] = (),
    debug_counter: DebugCounter | None = None,
    program: Any = None,
) -> PassResult:
    """One run of ``group`` on ``gm`` (:meth:`PassGroup.run`; a :class:`~fxpass.Pipeline`
    first checks its passes' requirements): a new :class:`~fxpass.core.PassContext`, the
    passes run in order with the group's checks, and the module put back as it was when a
    pass fails. Called from inside a pass of another run, it joins that run instead."""
    if not isinstance(gm, fx.GraphModule):
        raise TypeError(
            f"Pipeline.run expects a torch.fx.GraphModule, got {type(gm).__name__}; "
            "capture the model first (torch.export.export, torch.fx.symbolic_trace), "
            "or use fxpass.apply, which also takes an ExportedProgram"
        )
    outer = current_context()
    if outer is not None:  # called from inside a pass of another run: join it
        new_gm, modified = group._run_nested(gm, outer, None)
        return PassResult(new_gm, modified)
    check_nesting(group)  # a group nested before passes were added to it
    instruments = [*_GLOBAL_INSTRUMENTS.get(), *group.instrument, *instrument]
    ctx = PassContext(
        sample_inputs=sample_inputs,
        instruments=instruments,
        debug_counter=debug_counter,
        enabled=_enabled,
        program=program,
    )
    if group.verify_analyses is not None:
        ctx.analyses.verify = group.verify_analyses
    state = ctx._run
    state.recompiler = DeferredRecompile()
    state.full = verify_each_mode(getattr(group, "verify_each", None)) == "full"
    root = PassRecord(name=group.name, spec=str(group), nodes_before=len(gm.graph.nodes))
    report = Report(root=root, suppressed=state.suppressed)
    # rollback: the modules' own state now (cheap), the graphs' from the editor's
    # journal, or a whole-graph snapshot before the first pass that edits otherwise
    snapshot = state.snapshot = GraphSnapshot.take(gm, graphs=False)
    journal = state.journal = ctx.journal = Journal()
    state.snapshots = report.snapshots
    state.recompiler.install(gm)
    new_gm = gm
    t0 = time.perf_counter()
    try:
        with _activate(ctx):
            for inst in instruments:
                inst.before_pipeline(group, gm, ctx)
            if group.policy.check_input:
                run_checks([group], gm, ctx, "(input)")
            new_gm, modified = group._run_nested(gm, ctx, root)
    except PassFailedError as err:
        state.recompiler.finish(recompile=False)
        edited = snapshot.restore()
        journal.undo()
        root.seconds = time.perf_counter() - t0
        root.status = "failed"
        root.nodes_after = len(gm.graph.nodes)
        report.error = first_line(err)
        if edited:
            err.args = (
                f"{err.args[0]}\n  warning: tensors edited in place were not restored: "
                f"{', '.join(edited)}",
            )
        ctx.error = err
        err.report = report
        with _activate(ctx):
            for inst in instruments:
                inst.after_pipeline(group, gm, report, ctx)
        raise
    except BaseException:
        state.recompiler.finish(recompile=False)
        snapshot.restore()
        journal.undo()
        raise
    journal.clear()
    state.recompiler.finish()
    root.seconds = time.perf_counter() - t0
    root.modified = modified
    root.runs = 1
    root.nodes_after = len(new_gm.graph.nodes)
    with _activate(ctx):
        for inst in instruments:
            inst.after_pipeline(group, new_gm, report, ctx)
    stats = report.stats()
    return PassResult(new_gm, modified, stats, report=report)


def _interpret(p: Any, ret: Any, gm: fx.GraphModule, record: PassRecord):
    """(module after the pass, what the pass claimed about modification or None)."""
    if isinstance(ret, tuple) and hasattr(ret, "graph_module"):  # torch or fxpass PassResult
        for key, value in getattr(ret, "stats", {}).items():
            record.stats[key] = record.stats.get(key, 0) + value
        return ret.graph_module, bool(ret.modified)
    if isinstance(ret, bool):
        return gm, ret
    if ret is None:
        return gm, None
    if isinstance(ret, fx.GraphModule):
        return ret, None
    raise TypeError(
        f"pass '{p.name}' returned {type(ret).__name__}; a pass returns a bool, None, "
        "a PassResult or a GraphModule"
    )


_KEEP: Any = object()


def run_pass(p, gm, ctx, parent: PassRecord | None, record=None, keep=False):
    """Run one pass inside a run; returns (module, modified) or, with keep, also the record."""
    fresh = record is None
    if fresh:
        record = PassRecord(name=p.name, spec=p.spec, nodes_before=len(gm.graph.nodes))
        if parent is not None:
            parent.children.append(record)
    skipped = "disabled in the registry" if not ctx.enabled(p.name) else range_skip(p)
    if skipped is not None:
        record.status = "skipped"
        record.notes = [skipped]
        record.nodes_after = record.nodes_before
        return (gm, False, record) if keep else (gm, False)
    state = ctx._run
    leaf = not isinstance(p, PassGroup)
    journal = ctx.journal
    journaled = leaf and journal is not None and getattr(p, "edits", "any") == "editor"
    if leaf and not journaled and journal is not None and state.snapshot is not None:
        # the first pass that may edit outside the editor: a whole-graph snapshot from here
        # on (the journal keeps what came before it)
        state.snapshot.take_graphs()
        state.snapshots.append(p.name)
        journal = ctx.journal = None
    mark = journal.mark() if journaled else 0
    epoch = journal.epoch if journaled else 0
    audit = journal.audit_start(gm.graph) if journaled and state.full else None
    if journaled:
        before = None
    else:
        before = state.fp[1] if state.fp is not None and state.fp[0] is gm else fingerprint(gm)
    watched = watch(p, gm, ctx) if leaf else ()
    state.records.append(record)
    ctx.pass_path.append(p.name)
    for inst in ctx.instruments:
        inst.before_pass(record, gm, ctx)
    if p.needs_code:
        state.recompiler.ensure_code(gm)
    frame = ctx.analyses.enter(p.name, p.preserves, record)
    t0 = time.perf_counter()
    try:
        ret = p.execute(gm, ctx)
        new_gm, claimed = _interpret(p, ret, gm, record)
    except PassFailedError as e:
        record.seconds += time.perf_counter() - t0
        record.status = "failed"
        record.error = record.error or first_line(e)
        raise
    except Exception as e:
        record.seconds += time.perf_counter() - t0
        record.status = "failed"
        record.error = f"{type(e).__name__}: {e}"
        for inst in ctx.instruments:
            inst.on_failure(record, gm, e, ctx)
        raise PassFailedError(p.name, state.ran, e) from e
    finally:
        state.records.pop()
        ctx.pass_path.pop()
        ctx.analyses.leave(frame, gm, gm, False, leaf=leaf)  # a failed run drops the lot
    record.seconds += time.perf_counter() - t0
    record.runs += 1
    if new_gm is not gm:
        state.recompiler.install(new_gm)
        changed = True
        after = fingerprint(new_gm)
    elif journaled:
        structural = len(journal) != mark and journal.changed(epoch)
        changed = structural if claimed is None else (claimed or structural)
        after = _KEEP if not structural else None
    else:
        after = fingerprint(gm)
        structural = not same_fingerprint(before, after)
        changed = structural if claimed is None else (claimed or structural)
        if claimed is False and structural:
            note = "said it did not change the graph, but it did"
            if note not in record.notes:
                record.notes.append(note)
    if after is not _KEEP:  # a journaled pass that changed nothing keeps the last one
        state.fp = (new_gm, after) if after is not None else None
    state.touched = journal.touched(mark) if journaled and new_gm is gm else None
    ctx.analyses.leave(frame, gm, new_gm, changed, leaf=leaf)
    ctx.changed = changed
    record.modified |= changed
    record.nodes_after = len(new_gm.graph.nodes)
    for inst in ctx.instruments:
        inst.after_pass(record, new_gm, ctx)
    if changed:
        state.recompiler.mark_stale(new_gm)
        state.invariants.extend(c for c in p.invariants if c not in state.invariants)
    if audit is not None:
        check_journal(p, journal, audit, ctx, record)
    if leaf:
        after_leaf(p, new_gm, ctx, record, changed, watched, frame)
    return (new_gm, changed, record) if keep else (new_gm, changed)
