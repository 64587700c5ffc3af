"""The pass manager: an ordered, nestable list of passes run with checks and rollback.

>>> import fxpass as fp
>>> pipe = fp.Pipeline.parse("remove_assert_ops,fixpoint(cse,dce)")    # doctest: +SKIP
>>> result = pipe(gm)                                                   # doctest: +SKIP
>>> result.modified, result.report                                      # doctest: +SKIP

What a run guarantees:

* **Order.** Passes run in the order given, adjusted by ordering constraints
  (:meth:`Pipeline.this_before_that`), solved by a stable topological sort. A cycle is a
  :class:`~fxpass.ConstraintCycleError` naming the passes in it.
* **Honest "modified".** See :mod:`fxpass.core.contract`. A :class:`Fixpoint` stops as soon
  as one round changes nothing.
* **Checks.** After each pass that changed the graph: ``graph.lint()`` and the checks added
  with :meth:`Pipeline.add_checks` (a check raises or returns False). Checks added to a
  pipeline also run after the passes of pipelines nested in it, and the ``invariants`` a
  pass declares run after it and every later pass once it has changed the graph. A check
  with a ``before_pass(gm, pass)`` method also sees each pass's input: the pipeline calls
  it before every pass and ``after_pass(gm, pass, state, changed)`` after (how
  ``fxpass.verify.keeps_metadata`` checks what a pass declares it keeps). With
  ``suppress_check_failures=True`` a failure is recorded in the report and warned about.
* **Analyses.** Each run has an :class:`~fxpass.core.analysis_manager.AnalysisManager`
  (``ctx.analyses``): a pass that changed the graph drops the cached analyses it does not
  preserve; with ``verify_analyses`` the ones it preserves are computed again and compared.
* **Nothing lost.** If a pass raises or a check fails, the GraphModule given to the run is put
  back exactly as it was (same Node objects, same code) and a
  :class:`~fxpass.PassFailedError` names the failing pass and the passes that ran before it.
* **No wasted recompiles.** ``gm.recompile()`` calls during the run are deferred, and a
  module whose graph changed comes back with lazy code (torch's ``_LazyGraphModule``): it
  is generated once, when the module is next called, printed or saved
  (see :mod:`fxpass.core.recompile`).
"""

from __future__ import annotations

import contextlib
import contextvars
import time
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

from torch import fx

from ..fxutil.messages import first_line
from .checks import Check, after_leaf, run_checks, watch
from .context import DebugCounter, PassContext, _activate, current_context, scoped
from .contract import Pass, PassResult, as_pass, hooks
from .errors import (
    ConstraintCycleError,
    NonConvergenceError,
    PassFailedError,
)
from .instrument import Instrumentation
from .options import Option, Range
from .order import topological_order
from .ranges import range_skip
from .recompile import DeferredRecompile
from .report import PassRecord, Report
from .snapshot import GraphSnapshot, fingerprint, same_fingerprint

__all__ = ["Fixpoint", "Pipeline", "RunPolicy", "fixpoint", "instrumented"]

_GLOBAL_INSTRUMENTS: contextvars.ContextVar[tuple[Instrumentation, ...]] = contextvars.ContextVar(
    "fxpass_instruments", default=()
)


@contextlib.contextmanager
def instrumented(*instruments: Instrumentation) -> Iterator[None]:
    """Attach instrumentation to every pipeline run inside the block (backends, the CLI).

    >>> with fxpass.instrumented(fxpass.PrintIR(after_change=True)):   # doctest: +SKIP
    ...     torch.compile(model, backend="fxpass")(x)
    """
    with scoped(_GLOBAL_INSTRUMENTS, (*_GLOBAL_INSTRUMENTS.get(), *instruments)):
        yield


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


_DEFAULT_POLICY = RunPolicy()


class Pipeline(Pass):
    """An ordered list of passes that is itself a pass.

    Args:
        passes: anything :func:`fxpass.as_pass` accepts (functions, lowering functions,
            ``Pass`` objects, torch ``PassBase`` objects, registered names, pipelines).
        name: shown in reports; defaults to ``"pipeline"``.
        constraints: ``(before, after)`` pairs (passes or names), or torch-style callables
            ``constraint(a, b) -> bool`` that return False when ``a`` may not run before ``b``.
        checks: callables run after each pass that changed the graph.
        lint: run ``graph.lint()`` among the checks.
        run_checks_after_each_pass: run the checks at all (off: no lint, no user checks).
        suppress_check_failures: record and warn instead of raising when a check fails.
        instrument: instrumentation attached to every run of this pipeline.
        policy: how checks and the round limit apply (see :class:`RunPolicy`).
        verify_analyses: after each pass that changed the graph, compute the analyses it
            declares preserved again and fail when they differ (default: the
            ``FXPASS_VERIFY_ANALYSES`` environment variable).
    """

    name = "pipeline"
    #: a pass called on its own (``pass(gm)``): what it needs may have run earlier
    _alone = False

    def __init__(
        self,
        passes: Iterable[Any] = (),
        *,
        name: str | None = None,
        constraints: Iterable[Any] = (),
        checks: Iterable[Check] = (),
        lint: bool = True,
        run_checks_after_each_pass: bool = True,
        suppress_check_failures: bool = False,
        instrument: Iterable[Instrumentation] = (),
        policy: RunPolicy = _DEFAULT_POLICY,
        verify_analyses: bool | None = None,
    ) -> None:
        if isinstance(passes, str):  # iterating it would look up a pass per character
            raise TypeError(
                f"Pipeline({passes!r}) takes a list of passes; for a textual spec use "
                f"Pipeline.parse({passes!r})"
            )
        self._passes: list[Pass] = [as_pass(p) for p in passes]
        self.policy = policy
        self.verify_analyses = verify_analyses
        if name:
            self.name = name
        self._constraints: list[Any] = []
        self._ordered: list[Pass] | None = None
        self.checks: list[Check] = list(checks)
        self.lint = lint
        self.run_checks_after_each_pass = run_checks_after_each_pass
        self.suppress_check_failures = suppress_check_failures
        self.instrument: list[Instrumentation] = list(instrument)
        for c in constraints:
            self.add_constraint(c)

    # ----- building ---------------------------------------------------------------------
    def add(self, p: Any) -> Pipeline:
        """Append a pass; returns the pipeline so calls chain."""
        self._passes.append(as_pass(p))
        self._ordered = None
        return self

    add_pass = add

    def add_checks(self, *checks: Check) -> Pipeline:
        """Run ``checks`` after every pass that changes the graph (ExecuTorch's add_checks)."""
        self.checks.extend(checks)
        return self

    def add_constraint(self, constraint: Any) -> Pipeline:
        """Add a ``(before, after)`` pair or a torch-style ``constraint(a, b) -> bool``."""
        if isinstance(constraint, tuple) and len(constraint) == 2:
            constraint = tuple(constraint)
        elif not callable(constraint):
            raise TypeError(
                f"a constraint is a (before, after) pair or a callable (a, b) -> bool, "
                f"not {constraint!r}"
            )
        self._constraints.append(constraint)
        self._ordered = None
        return self

    def this_before_that(self, this: Any, that: Any) -> Pipeline:
        """Require pass ``this`` (a pass or its name) to run before ``that``."""
        return self.add_constraint((this, that))

    # ----- order ------------------------------------------------------------------------
    @property
    def passes(self) -> list[Pass]:
        """The passes in the order they will run (constraints applied)."""
        if self._ordered is None:
            self._ordered = self._solve()
        return list(self._ordered)

    def _matches(self, key: Any, p: Pass) -> bool:
        if isinstance(key, str):
            return p.name == key or p.spec == key
        return p is key or getattr(p, "fn", None) is key or getattr(p, "obj", None) is key

    def _solve(self) -> list[Pass]:
        passes = self._passes
        if not self._constraints:
            return list(passes)
        n = len(passes)
        succ: list[set[int]] = [set() for _ in range(n)]
        for c in self._constraints:
            for i, a in enumerate(passes):
                for j, b in enumerate(passes):
                    if i == j:
                        continue
                    if isinstance(c, tuple):
                        if self._matches(c[0], a) and self._matches(c[1], b):
                            succ[i].add(j)
                    else:
                        # torch semantics: c(a, b) is False when a must not come before b.
                        ua, ub = getattr(a, "fn", a), getattr(b, "fn", b)
                        if not c(ua, ub):
                            succ[j].add(i)
        order, indegree = topological_order(succ)
        if len(order) < n:
            left = {i for i in range(n) if indegree[i] > 0}
            raise ConstraintCycleError([passes[i].name for i in _find_cycle(succ, left)])
        return [passes[i] for i in order]

    # ----- text -------------------------------------------------------------------------
    @classmethod
    def parse(cls, spec: str, registry: Any = None, *, insert_required: bool = False) -> Pipeline:
        """Build a pipeline from text, e.g. ``"remove_assert_ops,fixpoint(cse,dce)"``;
        ``insert_required`` inserts the passes the spec's passes need but it lacks (see
        :mod:`fxpass.core.requirements`)."""
        if hooks.parse is None:  # pragma: no cover - fxpass.core imports the spec reader
            raise RuntimeError("import fxpass before parsing a pipeline spec")
        return hooks.parse(spec, registry, insert_required=insert_required)

    @property
    def body_spec(self) -> str:
        """The passes as a spec, without this pipeline's own name around them."""
        return ",".join(p.spec for p in self.passes)

    @property
    def head(self) -> str:
        """How the pipeline is written around its nested passes: ``pipeline``, ``fixpoint{...}``."""
        return "pipeline"

    @property
    def spec(self) -> str:
        return self.written_as or f"{self.head}({self.body_spec})"

    def __str__(self) -> str:
        return self.written_as or self.body_spec

    def __repr__(self) -> str:
        return f"Pipeline({str(self)!r})"

    def __len__(self) -> int:
        return len(self._passes)

    def __iter__(self) -> Iterator[Pass]:
        return iter(self.passes)

    # ----- running ----------------------------------------------------------------------
    def __call__(self, gm: fx.GraphModule, sample_inputs: Sequence[Any] | None = None, **kw):
        return self.run(gm, sample_inputs, **kw)

    def run(
        self,
        gm: fx.GraphModule,
        sample_inputs: Sequence[Any] | None = None,
        *,
        instrument: Iterable[Instrumentation] = (),
        debug_counter: DebugCounter | None = None,
    ) -> PassResult:
        """Run the pipeline on ``gm``; returns a :class:`PassResult` with a ``report``.

        ``sample_inputs`` reach lowering passes ``(gm, sample_inputs)``; ``debug_counter``
        limits how many rewrites the run may make (see :class:`~fxpass.DebugCounter`).
        """
        if not isinstance(gm, fx.GraphModule):
            raise TypeError(
                f"Pipeline.run expects a torch.fx.GraphModule, got {type(gm).__name__}; "
                "capture the model first (torch.export.export, torch.fx.symbolic_trace), "
                "or use fxpass.apply, which also takes an ExportedProgram"
            )
        outer = current_context()
        if outer is not None:  # called from inside a pass of another run: join it
            new_gm, modified = self._run_nested(gm, outer, None)
            return PassResult(new_gm, modified)
        if not self._alone:
            hooks.requirements(self)  # passes that need others before or after them
        instruments = [*_GLOBAL_INSTRUMENTS.get(), *self.instrument, *instrument]
        ctx = PassContext(
            sample_inputs=sample_inputs,
            instruments=instruments,
            debug_counter=debug_counter,
            enabled=hooks.enabled,
        )
        if self.verify_analyses is not None:
            ctx.analyses.verify = self.verify_analyses
        state = ctx._run
        state.recompiler = DeferredRecompile()
        root = PassRecord(name=self.name, spec=str(self), nodes_before=len(gm.graph.nodes))
        report = Report(root=root, suppressed=state.suppressed)
        snapshot = GraphSnapshot.take(gm)
        state.recompiler.install(gm)
        new_gm = gm
        t0 = time.perf_counter()
        try:
            with _activate(ctx):
                for inst in instruments:
                    inst.before_pipeline(self, gm, ctx)
                if self.policy.check_input:
                    run_checks([self], gm, ctx, "(input)")
                new_gm, modified = self._run_nested(gm, ctx, root)
        except PassFailedError as err:
            state.recompiler.finish(recompile=False)
            edited = snapshot.restore()
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
                    inst.after_pipeline(self, gm, report, ctx)
            raise
        except BaseException:
            state.recompiler.finish(recompile=False)
            snapshot.restore()
            raise
        state.recompiler.finish()
        root.seconds = time.perf_counter() - t0
        root.modified = modified
        root.runs = 1
        root.nodes_after = len(new_gm.graph.nodes)
        with _activate(ctx):
            for inst in instruments:
                inst.after_pipeline(self, new_gm, report, ctx)
        stats = report.stats()
        return PassResult(new_gm, modified, stats, report=report)

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
            gm, changed = _run_pass(p, gm, ctx, record)
            modified |= changed
        return gm, modified


#: A fixpoint's round limit: at least one round (the bound specs are checked against).
Iterations = Annotated[int, Range(min=1)]
_MAX_ITERATIONS = Option("max_iterations", Iterations)


class Fixpoint(Pipeline):
    """Run the nested passes in rounds until a round changes nothing (at most
    ``max_iterations`` rounds).

    If the last allowed round still changed the graph, ``strict=True`` raises
    :class:`~fxpass.NonConvergenceError` (and the run rolls back); otherwise the report notes
    that the fixpoint did not converge.
    """

    name = "fixpoint"

    def __init__(
        self,
        passes: Iterable[Any] = (),
        *,
        max_iterations: Iterations = 10,
        strict: bool = False,
        **kw: Any,
    ) -> None:
        _MAX_ITERATIONS.convert(max_iterations)  # the option's declared bounds, as in specs
        super().__init__(passes, **kw)
        self.max_iterations = max_iterations
        self.strict = strict

    @property
    def head(self) -> str:
        opts = []
        if self.max_iterations != 10:
            opts.append(f"max_iterations={self.max_iterations}")
        if self.strict:
            opts.append("strict=true")
        return "fixpoint" + ("{" + " ".join(opts) + "}" if opts else "")

    @property
    def spec(self) -> str:
        return self.written_as or f"{self.head}({self.body_spec})"

    def __str__(self) -> str:
        return self.spec

    def _run_body(self, gm, ctx, record):
        passes = self.passes
        records: list[PassRecord | None] = [None] * len(passes)
        modified = False
        for iteration in range(1, self.max_iterations + 1):
            round_changed = False
            for i, p in enumerate(passes):
                gm, changed, records[i] = _run_pass(p, gm, ctx, record, records[i], keep=True)
                round_changed |= changed
            modified |= round_changed
            if record is not None:
                record.stats["iterations"] = iteration
            if not round_changed:
                return gm, modified
        msg = (
            f"fixpoint({self.body_spec}) still changed the graph after "
            f"{self.max_iterations} iterations"
        )
        if self.strict:
            raise PassFailedError(self.name, ctx._run.ran, NonConvergenceError(msg))
        if not self.policy.warn_at_limit:
            return gm, modified
        if record is not None:
            record.notes.append(msg)
        warnings.warn(f"fxpass: {msg}", stacklevel=2)
        return gm, modified


def fixpoint(*passes: Any, max_iterations: int = 10, strict: bool = False) -> Fixpoint:
    """A :class:`Fixpoint` over ``passes``: ``fixpoint(cse, dce, max_iterations=5)``."""
    if len(passes) == 1 and isinstance(passes[0], (list, tuple)):
        passes = tuple(passes[0])
    return Fixpoint(passes, max_iterations=max_iterations, strict=strict)


def _interpret(p: Pass, ret: Any, gm: fx.GraphModule, record: PassRecord):
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


def _run_pass(p: Pass, gm, ctx, parent: PassRecord | None, record=None, keep=False):
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
    leaf = not isinstance(p, Pipeline)
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
    else:
        after = fingerprint(gm)
        structural = not same_fingerprint(before, after)
        changed = structural if claimed is None else (claimed or structural)
        if claimed is False and structural:
            note = "said it did not change the graph, but it did"
            if note not in record.notes:
                record.notes.append(note)
    state.fp = (new_gm, after)
    ctx.analyses.leave(frame, gm, new_gm, changed, leaf=leaf)
    ctx.changed = changed
    record.modified |= changed
    record.nodes_after = len(new_gm.graph.nodes)
    for inst in ctx.instruments:
        inst.after_pass(record, new_gm, ctx)
    if changed:
        state.recompiler.mark_stale(new_gm)
        state.invariants.extend(c for c in p.invariants if c not in state.invariants)
    if leaf:
        after_leaf(p, new_gm, ctx, record, changed, watched, frame)
    return (new_gm, changed, record) if keep else (new_gm, changed)


def _find_cycle(succ: list[set[int]], left: set[int]) -> list[int]:
    """One cycle among ``left``: each of them still has a predecessor in ``left``."""
    pred: dict[int, int] = {}
    for i in sorted(left):
        for j in succ[i]:
            if j in left:
                pred.setdefault(j, i)
    node, seen, path = min(left), {}, []
    while node not in seen:
        seen[node] = len(path)
        path.append(node)
        node = pred[node]
    cycle = path[seen[node] :][::-1]
    first = cycle.index(min(cycle))  # start at the earliest pass, for a stable message
    return cycle[first:] + cycle[:first]


def _run_alone(p: Pass, gm: fx.GraphModule, sample_inputs: Sequence[Any] | None = None, **kw):
    """``p(gm)``: the pass as a one-pass pipeline (honest "modified", rollback, one recompile)."""
    pipe = Pipeline([p], name=p.name)
    pipe._alone = True
    return pipe.run(gm, sample_inputs, **kw)


hooks.run_alone = _run_alone
