"""fxpass: write, compose, inspect, verify and apply compiler passes on PyTorch FX graphs."""

from __future__ import annotations

from ._supported_torch import check_torch as _check_torch

_check_torch()  # first: an untested torch gets one clear line, not an error from deep inside

from . import (  # noqa: F401  (importing passes registers the library)
    ops,
    passes,
    registry,
    streams,
)
from .core.analysis_manager import analysis
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
from .core.version import __version__
from .distributed import pipeline_stages, shard
from .html import HtmlReport
from .interpret import InterpreterPass
from .partition import (
    OperatorSupportBase,
    Partition,
    capability_partitions,
    fuse_partitions,
    parse_support,
    source_partitions,
    unfuse,
)
from .rewrite import P, Rule, RuleSet, rewrite, rules, traced_rule
from .targets.apply import ApplyResult, apply
from .targets.backend import backend
from .targets.inductor import inductor_pass
from .targets.piecewise import piecewise
from .verify import NumericsCheck, bisect, check_pass, verify_numerics

graph_pass = register


__all__ = [
    "ApplyResult",
    "ChangeEvent",
    "CheckFailedError",
    "ConstraintCycleError",
    "DebugCounter",
    "Fixpoint",
    "FunctionPass",
    "FxpassError",
    "HtmlReport",
    "Instrumentation",
    "InterpreterPass",
    "NonConvergenceError",
    "NumericsCheck",
    "OperatorSupportBase",
    "OptionError",
    "P",
    "Partition",
    "Pass",
    "PassContext",
    "PassFailedError",
    "PassRecord",
    "PassResult",
    "Pipeline",
    "PrintIR",
    "Report",
    "Rule",
    "RuleSet",
    "SpecError",
    "Statistics",
    "Timing",
    "UnknownPassError",
    "__version__",
    "analysis",
    "apply",
    "as_pass",
    "backend",
    "bisect",
    "capability_partitions",
    "check_pass",
    "current_context",
    "fixpoint",
    "fuse_partitions",
    "graph_pass",
    "inductor_pass",
    "instrumented",
    "parse_support",
    "piecewise",
    "pipeline_stages",
    "register",
    "registry",
    "rewrite",
    "rules",
    "shard",
    "source_partitions",
    "stat",
    "traced_rule",
    "unfuse",
    "verify_numerics",
]
