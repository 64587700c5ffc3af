"""torch.fx.passes.infra's pass manager, reimplemented on fxpass's pipeline.

Same names, signatures, ordering algorithm and error messages as
``torch.fx.passes.infra.pass_manager`` / ``pass_base``, so code written against torch runs
unchanged. What it gains:

* a failing pass leaves the module exactly as it was before the call (torch leaves it
  half-rewritten);
* the module's code is regenerated once per call, not after every pass;
* :func:`pass_result_wrapper` reports ``modified`` honestly (torch's always says True), so
  ``steps`` stops as soon as a round changes nothing;
* ``suppress_check_failures`` works (torch never reads it): failures are warned about and
  listed in ``PassManager.suppressed``;
* it is a door like ``fxpass.apply`` (:func:`~fxpass.compat._policy.run_managed`): the run's
  report in ``PassManager.report``, labelled ``door=torch.fx``; artifacts in torch's
  structured log while ``TORCH_TRACE`` is on; with ``cache=`` (a folder), the result of an
  earlier call on the same graph with the same passes is restored instead of running them.
"""

from __future__ import annotations

import abc
import inspect
from collections.abc import Callable
from functools import wraps
from typing import Any

from torch import fx, nn

from ..core.contract import Pass
from ..core.contract import PassResult as _FxpassPassResult
from ..core.errors import PassFailedError
from ..core.pass_order import topological_order
from ..core.snapshot import fingerprint, same_fingerprint
from ._policy import manager_rounds, pass_manager_error, pass_name, run_managed

__all__ = [
    "PassBase",
    "PassManager",
    "PassResult",
    "_topological_sort_passes",
    "pass_result_wrapper",
    "this_before_that_pass_constraint",
]

PassResult = _FxpassPassResult


class PassBase(Pass, abc.ABC):
    """Base interface for implementing passes (torch's ``PassBase``).

    Implement :meth:`call`; :meth:`requires` and :meth:`ensures` are optional. Calling an
    instance runs ``requires``, ``call`` and ``ensures`` and returns what ``call`` returned.
    """

    def __call__(self, graph_module: fx.GraphModule) -> PassResult | None:  # type: ignore[override]
        self.requires(graph_module)
        res = self.call(graph_module)
        self.ensures(graph_module)
        return res

    @abc.abstractmethod
    def call(self, graph_module: fx.GraphModule) -> PassResult | None:
        """The pass that is run through the given graph module."""


def _changed(before: Any, gm: Any) -> bool:
    return before is None or not same_fingerprint(before, fingerprint(gm))


def pass_result_wrapper(fn: Callable[..., Any]) -> Callable[..., PassResult | None]:
    """Make a pass that returns None or a module return a :class:`PassResult`.

    Unlike torch's, "modified" is True only if the pass actually changed the graph.
    """
    if fn is None:
        return None  # type: ignore[return-value]

    @wraps(fn)
    def wrapped_fn(gm: nn.Module) -> PassResult | None:
        before = fingerprint(gm) if isinstance(gm, fx.GraphModule) else None
        res = fn(gm)
        if res is None:
            return PassResult(gm, _changed(before, gm))
        if isinstance(res, _TorchPassResultTypes):
            return res
        elif isinstance(res, nn.Module):
            return PassResult(res, res is not gm or _changed(before, res))
        return None

    if not inspect.isfunction(fn):
        wrapped_fn.__name__ = type(fn).__name__
    return wrapped_fn


def _torch_pass_result_types() -> tuple[type, ...]:
    from torch.fx.passes.infra.pass_base import PassResult as TorchPassResult

    return (TorchPassResult,)


_TorchPassResultTypes = _torch_pass_result_types()


def _validate_pass_schedule_constraint(
    constraint: Callable[[Callable[..., Any], Callable[..., Any]], bool],
    passes: list[Callable[..., Any]],
) -> None:
    for i, a in enumerate(passes):
        for j, b in enumerate(passes[i + 1 :]):
            if constraint(a, b):
                continue
            raise RuntimeError(
                f"pass schedule constraint violated. Expected {a} before {b}"
                f" but found {a} at index {i} and {b} at index {j} in pass"
                f" list."
            )


def _topological_sort_passes(
    passes: list[Callable[..., Any]], constraints: list[Callable[..., Any]]
) -> list[Callable[..., Any]]:
    """Order ``passes`` so that every constraint holds (torch's algorithm and errors).

    A constraint ``c(a, b)`` returning False means ``a`` may not run before ``b``.
    Raises ``RuntimeError("Circular dependency detected ...")`` on a cycle.
    """
    if len(constraints) == 0:
        return passes
    # torch's edges: c(a, b) False puts b before a, once per constraint that says so
    succ: list[list[int]] = [[] for _ in passes]
    for i, a in enumerate(passes):
        for j, b in enumerate(passes):
            if a != b:
                succ[j].extend(i for c in constraints if not c(a, b))
    order, indegree = topological_order(succ, fifo=True)
    cycle_passes = [p for p, d in zip(passes, indegree, strict=True) if d != 0]
    if cycle_passes:
        raise RuntimeError(
            f"Circular dependency detected within the following passes: {cycle_passes}"
        )
    return [passes[i] for i in order]


def this_before_that_pass_constraint(
    this: Callable[..., Any], that: Callable[..., Any]
) -> Callable[[Callable[..., Any], Callable[..., Any]], bool]:
    """A constraint under which ``this`` must run before ``that``."""

    def depends_on(a: Callable[..., Any], b: Callable[..., Any]) -> bool:
        return a != that or b != this

    return depends_on


class _ManagedPass(Pass):
    """One of a PassManager's passes: called as torch calls it, its result checked as torch does."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.name = pass_name(fn)

    def execute(self, gm: fx.GraphModule, ctx: Any) -> Any:
        res = self.fn(gm)
        if not isinstance(res, _TorchPassResultTypes) and not hasattr(res, "graph_module"):
            raise TypeError(
                f"The result of the pass {self.name} should be type PassResult."
                + "Please wrap it with pass_result_wrapper()"
            )
        return res


class PassManager:
    """Collects passes and constraints, orders the passes and runs them (torch's PassManager).

    Args:
        passes: callables that take a module and return a ``PassResult``.
        constraints: callables ``(a, b) -> bool``, False when ``a`` may not run before ``b``.
        steps: the most rounds to run; a round that changes nothing ends the run.
        run_checks_after_each_pass: run ``check`` after each pass.
        suppress_check_failures: warn about failing checks instead of raising.
        cache: a folder (or :class:`~fxpass.core.cache.PipelineCache`) that keeps the
            results of runs on GraphModules (fxpass's; torch's manager has none).
    """

    #: how the run's report names this door (``report.where["door"]``)
    door = "torch.fx"
    passes: list[Callable[..., PassResult | None]]
    constraints: list[Callable[[Callable[..., Any], Callable[..., Any]], bool]]
    _validated: bool = False
    steps: int = 1

    def __init__(
        self,
        passes: list[Callable[..., PassResult | None]] | None = None,
        constraints: list[Callable[[Callable[..., Any], Callable[..., Any]], bool]] | None = None,
        steps: int | None = None,
        run_checks_after_each_pass: bool = False,
        suppress_check_failures: bool = False,
        *,
        cache: Any = None,
    ) -> None:
        self.passes = passes or []
        self.constraints = constraints or []
        if steps:
            self.steps = steps
        self.run_checks_after_each_pass = run_checks_after_each_pass
        self.suppress_check_failures = suppress_check_failures
        self.suppressed: list[str] = []
        self.report: Any = None
        self.cache = cache

    def add_pass(self, _pass: Callable[..., PassResult | None]) -> None:
        """Adds a pass into the current list of passes."""
        self.passes.append(_pass)
        self._validated = False

    def add_constraint(
        self, constraint: Callable[[Callable[..., Any], Callable[..., Any]], bool]
    ) -> None:
        """Adds a constraint into the current list of constraints."""
        self.constraints.append(constraint)
        self._validated = False

    def validate_constraints(self) -> None:
        """Raise if the current pass order breaks a constraint."""
        if self._validated:
            return
        for constraint in self.constraints:
            _validate_pass_schedule_constraint(constraint, self.passes)
        self._validated = True

    def solve_constraints(self) -> None:
        """Order the passes so that every constraint holds."""
        self.passes = _topological_sort_passes(self.passes, self.constraints)
        self._validated = True

    def add_checks(self, check: Callable[[nn.Module], None]) -> None:
        """Set the function run on the module before the passes and after each pass."""
        sig = inspect.signature(check)
        if len(list(sig.parameters.values())) != 1:
            raise TypeError("PassManager check function should only take in one variable, a module")
        setattr(self, "check", check)  # noqa: B010

    def check(self, module: nn.Module) -> None:
        pass

    def __call__(self, module: nn.Module) -> PassResult:
        """Run the passes on ``module`` up to ``steps`` rounds, until a round changes nothing."""
        if not self._validated:
            self.solve_constraints()
        self.check(module)
        if not isinstance(module, fx.GraphModule):
            return self._call_plain(module)
        rounds = manager_rounds(
            self, [_ManagedPass(p) for p in self.passes], self.check, "PassManager"
        )
        try:
            result = run_managed(rounds, module, door=self.door, cache=self.cache)
        except PassFailedError as e:
            names = [pass_name(p) for p in self.passes]
            raise pass_manager_error(names, e.pass_name) from e.cause
        self.report = result.report
        self.suppressed = list(result.report.suppressed)
        return PassResult(result.graph_module, result.modified, result.stats, result.report)

    def _call_plain(self, module: nn.Module) -> PassResult:
        """Modules that are not GraphModules: run as torch does (nothing to snapshot)."""
        overall_modified = False
        for _ in range(self.steps):
            modified = False
            for i, fn in enumerate(self.passes):
                try:
                    res = _ManagedPass(fn).execute(module, None)
                    module = res.graph_module
                    modified = modified or res.modified
                    if self.run_checks_after_each_pass:
                        self.check(module)
                except Exception as e:
                    names = [pass_name(p) for p in self.passes]
                    raise pass_manager_error(names, i) from e
            overall_modified = overall_modified or modified
            if not modified:
                break
        return PassResult(module, overall_modified)
