"""The core of fxpass: pass contract, pipeline, registry, spec, instrumentation, report.

The modules are layered, and each calls only the ones below it: ``run`` (the engine that
runs a group of passes) < ``contract`` (what a pass is; ``pass(gm)`` runs it through the
engine) < ``registry`` (names) < ``requirements`` < ``spec`` (text) < ``pipeline`` (names,
order and text around the engine; it registers ``fixpoint``, ``pipeline`` and ``default``).
Importing this package imports ``pipeline``, so they are registered, and ``analyses``, so
the standard analyses are registered by name.
"""

from . import analyses as _analyses  # noqa: F401  (registers the standard analyses)
from . import pipeline as _pipeline  # noqa: F401  (registers the passes that nest passes)
from .context import ChangeEvent, DebugCounter
from .errors import (
    CheckFailedError,
    ConstraintCycleError,
    FxpassError,
    NestingError,
    NonConvergenceError,
    OptionError,
    PassFailedError,
    SpecError,
    UnknownPassError,
)
from .instrument import Instrumentation, PrintIR, Statistics, Timing
from .pipeline import instrumented
from .report import PassRecord

# The machinery beside what a pass author needs at the top level (``fxpass``): every error,
# the instrumentations, the debug counter, the change events and a report's records.
__all__ = [
    "ChangeEvent",
    "CheckFailedError",
    "ConstraintCycleError",
    "DebugCounter",
    "FxpassError",
    "Instrumentation",
    "NestingError",
    "NonConvergenceError",
    "OptionError",
    "PassFailedError",
    "PassRecord",
    "PrintIR",
    "SpecError",
    "Statistics",
    "Timing",
    "UnknownPassError",
    "instrumented",
]
