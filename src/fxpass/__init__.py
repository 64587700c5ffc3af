"""fxpass: write, compose, inspect, verify and apply compiler passes on PyTorch FX graphs."""

from __future__ import annotations

from ._supported_torch import check_torch as _check_torch

_check_torch()  # first: an untested torch gets one clear line, not an error from deep inside

from . import (  # noqa: F401  (importing passes registers the library; the rest are homes)
    core,
    distributed,
    html,
    ops,
    partition,
    passes,
    registry,
    streams,
)
from ._moved import moved_name as _moved_name
from .core.analysis_manager import analysis
from .core.context import PassContext, current_context, stat
from .core.contract import FunctionPass, Pass, PassResult
from .core.errors import FxpassError, PassFailedError
from .core.pass_registry import as_pass, register
from .core.pipeline import Fixpoint, Pipeline, fixpoint
from .core.report import Report
from .core.version import __version__
from .distributed import shard
from .interpret import InterpreterPass
from .rewrite import P, Rule, RuleSet, rewrite, rules, traced_rule
from .targets.apply import ApplyResult, apply
from .targets.backend import backend
from .targets.inductor import inductor_pass
from .targets.piecewise import piecewise
from .verify import NumericsCheck, bisect, check_pass, verify_numerics

# What a pass author needs: write a pass, register and compose it, rewrite with patterns, run
# it on a program, check it. Everything else lives in its subpackage (``fxpass.core`` for the
# errors, instrumentations and debug counter, ``fxpass.partition``, ``fxpass.html``,
# ``fxpass.distributed``, ``fxpass.registry``).
__all__ = [
    "ApplyResult",
    "Fixpoint",
    "FunctionPass",
    "FxpassError",
    "InterpreterPass",
    "NumericsCheck",
    "P",
    "Pass",
    "PassContext",
    "PassFailedError",
    "PassResult",
    "Pipeline",
    "Report",
    "Rule",
    "RuleSet",
    "__version__",
    "analysis",
    "apply",
    "as_pass",
    "backend",
    "bisect",
    "check_pass",
    "current_context",
    "fixpoint",
    "inductor_pass",
    "piecewise",
    "register",
    "rewrite",
    "rules",
    "shard",
    "stat",
    "traced_rule",
    "verify_numerics",
]


def __getattr__(name: str):
    """A name that left the top level still resolves, with a FutureWarning that says where it
    lives now."""
    return _moved_name(name)
