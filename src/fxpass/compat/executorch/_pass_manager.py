"""ExecuTorch's pass managers on fxpass's pipeline.

``PassManager`` (on a GraphModule) and ``ExportedProgramPassManager`` (on an
ExportedProgram) take the arguments ExecuTorch's take, order passes the same way, run the
same checks and raise the same errors. Underneath, the passes run as one fxpass
:class:`~fxpass.Fixpoint` of ``steps`` rounds, so

* a pass that fails, or a check that fails after it, leaves the module and the program as
  they were before the call (ExecuTorch leaves them half-transformed);
* module code is regenerated once per call, not after every pass;
* "modified" is honest (a function pass returning None counts as changing the graph only
  if it did), so ``steps`` stops at the first round that changes nothing;
* ``suppress_check_failures=True`` warns about failing checks instead of raising (ExecuTorch
  stores the flag and never reads it); the messages are in ``manager.suppressed``.

ExecuTorch's run policy — checks after every pass when asked, failures raised or suppressed,
a round limit that is not an error — is torch's: both run their rounds as
:func:`fxpass.compat._policy.manager_rounds` and fail with the same error. Both run them
through fxpass's one Runner (:func:`fxpass.compat._policy.run_managed`): reports labelled
``door=executorch``, ``TORCH_TRACE`` artifacts, and for ``PassManager`` a pipeline cache
(``cache=``). ``ExportedProgramPassManager`` takes no cache: its passes change what the
graph does not hold (the signature, state dict and constants), which a cached graph
cannot bring back.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from executorch.exir._program_utils import (
    _get_updated_graph_signature,
    _get_updated_range_constraints,
)
from executorch.exir.error import ExportError, ExportErrorType
from executorch.exir.pass_manager import _can_eliminate_common_getitems
from torch import fx
from torch.export import ExportedProgram
from torch.export.exported_program import _common_getitem_elimination_pass
from torch.utils import _pytree as pytree

from ...core.context import detached
from ...core.contract import Pass
from ...core.contract import PassResult as _FxpassPassResult
from ...core.errors import PassFailedError
from ...fxutil.fx_internals import make_lazy
from .._pass_infra import PassManager as _TorchPassManager
from .._pass_infra import pass_result_wrapper
from .._policy import manager_rounds, pass_manager_error, pass_name, run_managed
from ._checked import checked, program_state, remember_checked
from ._pass_base import ExportedProgramPassBase, ExportedProgramPassResult

__all__ = ["ExportedProgramPassManager", "PassManager"]

PassType = ExportedProgramPassBase | Callable[[fx.GraphModule], Any]


def _reject_call_method(graph_module: fx.GraphModule) -> None:
    for node in graph_module.graph.nodes:
        if node.op == "call_method":
            raise ExportError(
                ExportErrorType.NOT_SUPPORTED,
                f"call_method `{node}` is not supported except for backend delegate.",
            )


class PassManager(_TorchPassManager):
    """Runs passes on a GraphModule (ExecuTorch's legacy ``PassManager``).

    Args:
        passes: callables taking a GraphModule (nested lists are flattened); those returning
            None are wrapped with :func:`~fxpass.compat.fx.pass_result_wrapper`.
        run_checks_after_each_pass: run :meth:`check` after every pass.
        suppress_check_failures: warn about failing checks instead of raising.
        steps: the most rounds; a round that changes nothing ends the run.
        cache: a folder (or :class:`~fxpass.core.cache.PipelineCache`) that keeps the
            results of runs (fxpass's; ExecuTorch's manager has none).
    """

    door = "executorch"

    def __init__(
        self,
        passes: list[Any] | None = None,
        run_checks_after_each_pass: bool = False,
        suppress_check_failures: bool = False,
        steps: int = 1,
        *,
        cache: Any = None,
    ) -> None:
        flattened = [pass_result_wrapper(fn) for fn in pytree.tree_flatten(passes or [])[0]]
        super().__init__(
            flattened,
            run_checks_after_each_pass=run_checks_after_each_pass,
            suppress_check_failures=suppress_check_failures,
            steps=steps,
            cache=cache,
        )

    def __call__(self, module: torch.nn.Module) -> Any:  # type: ignore[override]
        with detached():  # a run of its own, also when a pass calls the manager
            return super().__call__(module)

    def check(self, module: torch.nn.Module) -> None:
        """The module is a GraphModule whose graph lints and has no ``call_method`` node."""
        assert isinstance(module, fx.GraphModule)
        module.recompile()
        module.graph.lint()
        _reject_call_method(module)


class _Program:
    """The program being transformed, and what to put back if the run fails: the dicts and
    the signature it shares with the caller's program."""

    def __init__(self, program: ExportedProgram) -> None:
        self.program = program
        signature = program.graph_signature
        self._saved = (
            signature,
            list(signature.input_specs),
            list(signature.output_specs),
            dict(program.state_dict),
            dict(program.constants),
        )

    def restore(self) -> None:
        signature, inputs, outputs, state, constants = self._saved
        signature.input_specs, signature.output_specs = inputs, outputs
        for mapping, saved in (
            (self.program.state_dict, state),
            (self.program.constants, constants),
        ):
            mapping.clear()
            mapping.update(saved)


class _ProgramPass(Pass):
    """One of the manager's passes, run on the program as ExecuTorch runs it."""

    def __init__(self, fn: Any, run: _Program) -> None:
        self.fn = fn
        self.run = run
        self.name = pass_name(fn)

    def execute(self, gm: fx.GraphModule, ctx: Any) -> Any:
        program = self.run.program
        if isinstance(self.fn, ExportedProgramPassBase):
            result = self.fn(program)
            program = self.run.program = result.exported_program
            if result.modified:
                program.graph_module.recompile()
            return _FxpassPassResult(program.graph_module, result.modified)
        res = self.fn(program.graph_module)
        if res is None:
            raise TypeError(
                f"The result of pass {self.name} should be type PassResult. "
                "Please wrap it with pass_result_wrapper()"
            )
        if res.modified:  # ExecuTorch updates the program in place, checks come later
            signature = _get_updated_graph_signature(program.graph_signature, res.graph_module)
            if _can_eliminate_common_getitems(res.graph_module):
                _common_getitem_elimination_pass(
                    res.graph_module, signature, program.module_call_graph
                )
            res.graph_module.recompile()
            program._graph_module = res.graph_module
            program._graph_signature = signature
            program._range_constraints = _get_updated_range_constraints(res.graph_module)
        return _FxpassPassResult(program.graph_module, res.modified)


class ExportedProgramPassManager(_TorchPassManager):
    """Runs passes on an ExportedProgram: GraphModule passes and
    :class:`~fxpass.compat.executorch.ExportedProgramPassBase` passes, mixed.

    After a GraphModule pass that changed the graph, the program takes the new module, an
    updated graph signature and range constraints (as ExecuTorch does). Calling the manager
    returns an :class:`ExportedProgramPassResult` with a shallow copy of the program.
    """

    door = "executorch"

    def __init__(
        self,
        passes: list[Any] | None = None,
        constraints: list[Callable[[Callable, Callable], bool]] | None = None,
        run_checks_after_each_pass: bool = False,
        suppress_check_failures: bool = False,
        steps: int = 1,
    ) -> None:
        wrapped = [
            fn if isinstance(fn, ExportedProgramPassBase) else pass_result_wrapper(fn)
            for fn in pytree.tree_flatten(passes or [])[0]
        ]
        super().__init__(
            wrapped,
            constraints=constraints,
            run_checks_after_each_pass=run_checks_after_each_pass,
            suppress_check_failures=suppress_check_failures,
            steps=steps,
        )

    def check(self, exported_program: ExportedProgram) -> None:  # type: ignore[override]
        """The graph lints, has no ``call_method`` node, and the program validates (not
        again on a program state that already passed: see :mod:`._checked`)."""
        state = program_state(exported_program)
        if checked(exported_program, state):
            return
        graph_module = exported_program.graph_module
        make_lazy(graph_module)  # ExecuTorch recompiles here: the code, made when first used
        graph_module.graph.lint()
        _reject_call_method(graph_module)
        exported_program.validate()
        remember_checked(exported_program, state)

    def __call__(  # type: ignore[override]
        self, exported_program: ExportedProgram, override_verifiers: list[Any] | None = None
    ) -> ExportedProgramPassResult:
        """Run the passes on a shallow copy of ``exported_program``."""
        if not self._validated:
            self.solve_constraints()
        exported_program = copy.copy(exported_program)
        if override_verifiers:
            exported_program._verifiers = override_verifiers
        self.check(exported_program)
        run = _Program(exported_program)
        passes = [_ProgramPass(fn, run) for fn in self.passes]
        rounds = manager_rounds(
            self, passes, lambda gm: self.check(run.program), type(self).__name__
        )
        try:
            with detached():  # a run of its own, also when a pass calls the manager
                result = run_managed(rounds, exported_program.graph_module, door=self.door)
        except PassFailedError as e:
            run.restore()
            names = [pass_name(p) for p in self.passes]
            raise pass_manager_error(names, e.pass_name) from e.cause  # ExecuTorch's, word for word
        self.report = result.report
        self.suppressed = list(result.report.suppressed)
        self.check(run.program)
        return ExportedProgramPassResult(run.program, result.modified)
