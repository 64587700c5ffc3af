"""The pass manager: an ordered, nestable list of passes run with checks and rollback.

>>> import fxpass as fp
>>> pipe = fp.Pipeline.parse("remove_assert_ops,fixpoint(cse,dce)")    # doctest: +SKIP
>>> result = pipe(gm)                                                   # doctest: +SKIP
>>> result.modified, result.report                                      # doctest: +SKIP

What a run guarantees:

* **Order.** Passes run in the order given, adjusted by ordering constraints
  (:meth:`Pipeline.this_before_that`), solved by a stable topological sort. A cycle is a
  :class:`~fxpass.core.ConstraintCycleError` naming the passes in it.
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

import warnings
from collections.abc import Iterable
from typing import Annotated, Any

from torch import fx

from .checks import Check
from .context import current_context
from .contract import Pass
from .errors import ConstraintCycleError, NestingError, NonConvergenceError, PassFailedError
from .instrument import Instrumentation
from .options import Option, Range
from .pass_order import topological_order
from .pass_registry import REGISTRY, Registry, as_pass
from .report import PassRecord
from .requirements import check_requirements
from .run import (
    DEFAULT_POLICY,
    PassGroup,
    PassResult,
    RunPolicy,
    check_nesting,
    instrumented,
    run_group,
    run_pass,
)
from .spec import build_pipeline

__all__ = [
    "Fixpoint",
    "Pipeline",
    "RunPolicy",
    "fixpoint",
    "instrumented",
    "register_pipelines",
    "resolve_pipeline",
]


class Pipeline(PassGroup, Pass):
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
        verify_each: how much of the graph the checks after a pass look at: ``"changed"``
            (the nodes it changed through the editor and their neighbours; the whole graph
            after a pass that edits otherwise) or ``"full"`` (the whole graph, and the
            input; default: ``$FXPASS_VERIFY_EACH``, else ``"changed"``).
        verify_analyses: after each pass that changed the graph, compute the analyses it
            declares preserved again and fail when they differ (default: the
            ``FXPASS_VERIFY_ANALYSES`` environment variable).
    """

    name = "pipeline"

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
        policy: RunPolicy = DEFAULT_POLICY,
        verify_analyses: bool | None = None,
        verify_each: str | None = None,
    ) -> None:
        if isinstance(passes, str):  # iterating it would look up a pass per character
            raise TypeError(
                f"Pipeline({passes!r}) takes a list of passes; for a textual spec use "
                f"Pipeline.parse({passes!r})"
            )
        super().__init__(
            [as_pass(p) for p in passes],
            name=name,
            checks=checks,
            lint=lint,
            run_checks_after_each_pass=run_checks_after_each_pass,
            suppress_check_failures=suppress_check_failures,
            instrument=instrument,
            policy=policy,
            verify_analyses=verify_analyses,
            verify_each=verify_each,
        )
        self._constraints: list[Any] = []
        self._ordered: list[Pass] | None = None
        for c in constraints:
            self.add_constraint(c)

    # ----- building ---------------------------------------------------------------------
    def add(self, p: Any) -> Pipeline:
        """Append a pass; returns the pipeline so calls chain."""
        self._passes.append(as_pass(p))
        try:
            check_nesting(self)
        except NestingError:
            self._passes.pop()
            raise
        self._ordered = None
        return self

    add_pass = add

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

    def set_passes(self, passes: Iterable[Any]) -> None:
        super().set_passes(as_pass(p) for p in passes)
        self._ordered = None

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
        return build_pipeline(spec, registry, make=cls, insert_required=insert_required)

    @property
    def spec(self) -> str:
        return self.written_as or f"{self.head}({self.body_spec})"

    def __repr__(self) -> str:
        return f"Pipeline({str(self)!r})"

    def run(self, gm: fx.GraphModule, sample_inputs: Any = None, **kw: Any) -> PassResult:
        """Run the pipeline on ``gm``; returns a :class:`PassResult` with a ``report``.

        ``sample_inputs`` reach lowering passes ``(gm, sample_inputs)``; ``debug_counter``
        limits how many rewrites the run may make (see :class:`~fxpass.core.DebugCounter`);
        ``instrument`` adds instrumentation to this run. A pipeline that breaks what its
        passes need before or after them is refused before it runs.
        """
        if isinstance(gm, fx.GraphModule) and current_context() is None:
            check_requirements(self)
        return run_group(self, gm, sample_inputs, **kw)


#: A fixpoint's round limit: at least one round (the bound specs are checked against).
Iterations = Annotated[int, Range(min=1)]
_MAX_ITERATIONS = Option("max_iterations", Iterations)


class Fixpoint(Pipeline):
    """Run the nested passes in rounds until a round changes nothing (at most
    ``max_iterations`` rounds).

    If the last allowed round still changed the graph, ``strict=True`` raises
    :class:`~fxpass.core.NonConvergenceError` (and the run rolls back); otherwise the report notes
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
                gm, changed, records[i] = run_pass(p, gm, ctx, record, records[i], keep=True)
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


def resolve_pipeline(pipeline: Any = None) -> Pipeline:
    """Turn what :func:`fxpass.apply` and the targets accept into a :class:`~fxpass.Pipeline`.

    None is the registered ``default`` pipeline as it stands now; a string is a spec; a
    list is a pipeline of those passes; a single pass runs alone.
    """
    if pipeline is None:
        made = REGISTRY.create("default")
        return made if isinstance(made, Pipeline) else Pipeline([made], name="default")
    if isinstance(pipeline, Pipeline):
        return pipeline
    if isinstance(pipeline, str):
        return Pipeline.parse(pipeline)
    if isinstance(pipeline, (list, tuple)):
        return Pipeline(pipeline)
    p = as_pass(pipeline)
    return p if isinstance(p, Pipeline) else Pipeline([p], name=p.name)


def register_pipelines(reg: Registry) -> None:
    """Register the passes that nest passes in ``reg``: ``fixpoint(...)``, ``pipeline(...)``
    and ``default`` (the ``default`` pass list as a pipeline). fxpass's registry has them; a
    registry made apart (``Registry(entry_points=False)``) gets them from this call."""

    def pipeline(passes: list) -> Pipeline:
        """A nested pipeline (groups passes, e.g. for constraints or reporting)."""
        return Pipeline(passes)

    def default() -> Pipeline:
        """The default pipeline: the passes in the 'default' pass list."""
        return Pipeline([reg.create(n) for n in reg.pass_list("default")], name="default")

    # Fixpoint declares its options (and their bounds); each factory makes the pipeline itself
    reg.register_factory(Fixpoint, takes_pipeline=True)
    reg.register_factory(pipeline, takes_pipeline=True)
    reg.register_factory(default)


register_pipelines(REGISTRY)
