"""Names that left ``fxpass``'s top level, and where they live now.

``fxpass.DebugCounter`` and the like keep resolving (with a :class:`FutureWarning` naming the
new home) so code written against the wider top level of earlier releases runs unchanged
while it moves its imports.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

__all__ = ["MOVED", "moved_name"]

#: Each moved name, by the module that is its home now.
MOVED: dict[str, tuple[str, ...]] = {
    "fxpass.core": (
        "ChangeEvent",
        "CheckFailedError",
        "ConstraintCycleError",
        "DebugCounter",
        "Instrumentation",
        "NonConvergenceError",
        "OptionError",
        "PassRecord",
        "PrintIR",
        "SpecError",
        "Statistics",
        "Timing",
        "UnknownPassError",
        "instrumented",
    ),
    "fxpass.html": ("HtmlReport",),
    "fxpass.partition": (
        "OperatorSupportBase",
        "Partition",
        "capability_partitions",
        "fuse_partitions",
        "parse_support",
        "source_partitions",
        "unfuse",
    ),
    "fxpass.distributed": ("pipeline_stages",),
    # ``graph_pass`` was another name for ``register``.
    "fxpass.core.pass_registry": ("graph_pass",),
}
_HOME = {name: home for home, names in MOVED.items() for name in names}


def moved_name(name: str) -> Any:
    """The object ``fxpass.<name>`` named before it moved; AttributeError for any other."""
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'fxpass' has no attribute {name!r}")
    new = "register" if name == "graph_pass" else name
    where = "fxpass.register" if name == "graph_pass" else f"{home}.{name}"
    warnings.warn(
        f"fxpass.{name} moved to {where}; import it from there (fxpass's top level keeps "
        "what a pass author needs)",
        FutureWarning,
        stacklevel=3,
    )
    return getattr(importlib.import_module(home), new)
