"""fxpass: write, compose, inspect, verify and apply compiler passes on PyTorch FX graphs."""

from __future__ import annotations

from . import passes, registry  # noqa: F401  (importing passes registers the library)
from . import ops  # noqa: F401  (registers the fused ops under torch.ops.fxpass)
from .core.context import ChangeEvent, DebugCounter, PassContext, current_context, stat
from .core.contract import FunctionPass, Pass, PassResult, as_pass
from .core.errors import (
    CheckFailedError,
    ConstraintCycleError,
    FxpassError,
    NonConvergenceError,
    OptionError,
    PassFailedError,
    SpecError,
    UnknownPassError,
)
from .core.instrument import Instrumentation, PrintIR, Statistics, Timing
from .core.pipeline import Fixpoint, Pipeline, fixpoint, instrumented
from .core.registry import register
from .core.report import PassRecord, Report

graph_pass = register

__version__ = "0.1.0"

__all__ = [
    "ChangeEvent",
    "CheckFailedError",
    "ConstraintCycleError",
    "DebugCounter",
    "Fixpoint",
    "FunctionPass",
    "FxpassError",
    "Instrumentation",
    "NonConvergenceError",
    "OptionError",
    "Pass",
    "PassContext",
    "PassFailedError",
    "PassRecord",
    "PassResult",
    "Pipeline",
    "PrintIR",
    "Report",
    "SpecError",
    "Statistics",
    "Timing",
    "UnknownPassError",
    "__version__",
    "as_pass",
    "current_context",
    "fixpoint",
    "graph_pass",
    "instrumented",
    "register",
    "registry",
    "stat",
]
