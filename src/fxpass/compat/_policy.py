"""How torch's and ExecuTorch's pass managers run, as a policy handed to fxpass's pipeline.

Both managers (:mod:`fxpass.compat.fx`'s ``PassManager`` and
:mod:`fxpass.compat.executorch`'s two) run their passes as :func:`manager_rounds` under
:data:`PASS_MANAGER`, and fail with :func:`pass_manager_error`: one policy, one error.
They, and SGLang's manager (:mod:`fxpass.compat.sglang`), are doors like ``fxpass.apply``:
each runs its pipeline through :func:`run_managed`, the one :class:`~fxpass.targets.runner.Runner`
(a pipeline cache when the manager was given one, ``TORCH_TRACE`` artifacts, the report
labelled with the door in ``report.where``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

from torch import fx

from ..core.contract import Pass, PassResult
from ..core.pipeline import Fixpoint, Pipeline, RunPolicy
from ..targets.runner import Runner

__all__ = ["PASS_MANAGER", "manager_rounds", "pass_manager_error", "pass_name", "run_managed"]

#: torch's ``PassManager`` and ExecuTorch's: the manager checks its input itself, runs its
#: check after every pass (changed or not), and its ``steps`` is a cap on the rounds, not a
#: promise of convergence (reaching it is not worth a warning).
PASS_MANAGER = RunPolicy(check_input=False, check_unchanged=True, warn_at_limit=False)


def manager_rounds(
    manager: Any, passes: Sequence[Pass], check: Callable[[Any], Any], name: str
) -> Fixpoint:
    """The rounds a torch-style ``manager`` runs: ``passes`` at most ``manager.steps`` times
    (a round that changes nothing ends the run), ``check`` after every pass when
    ``manager.run_checks_after_each_pass`` (the manager's check lints, so the pipeline does
    not), its failures raised, or warned about when ``manager.suppress_check_failures``."""
    return Fixpoint(
        passes,
        max_iterations=manager.steps,
        name=name,
        lint=False,
        checks=[check],
        run_checks_after_each_pass=manager.run_checks_after_each_pass,
        suppress_check_failures=manager.suppress_check_failures,
        policy=PASS_MANAGER,
    )


def run_managed(
    pipeline: Pipeline, gm: fx.GraphModule, *, door: str, cache: Any = None
) -> PassResult:
    """Run a manager's ``pipeline`` on ``gm`` through the one Runner, as every door does:
    restored from (and kept in) ``cache`` when one is given, traced while ``TORCH_TRACE``
    is on, its report labelled ``where["door"] = door`` (and the pipeline's name)."""
    return Runner(pipeline, cache=cache, where={"door": door}).run(gm)


def pass_name(fn: Any) -> str:
    """A pass's name as torch and ExecuTorch print it: a function's name, else its class's."""
    return fn.__name__ if inspect.isfunction(fn) else type(fn).__name__


def pass_manager_error(names: Sequence[str], failed: str | int) -> Exception:
    """torch's error, word for word, for the pass ``failed`` (its name, or its index in
    ``names``, the manager's passes in order) — raise it from the pass's exception."""
    index = (
        failed
        if isinstance(failed, int)
        else next((i for i, n in enumerate(names) if n == failed), 0)
    )
    name = names[index] if isinstance(failed, int) else failed
    return Exception(
        f"An error occurred when running the '{name}' pass after the following passes: "
        f"{list(names[:index])}"
    )
