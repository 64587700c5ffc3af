"""Verification: numerics against the original, bisection to the first bad pass or rewrite,
metadata and layout invariants, multi-stream schedules, and a test harness for pass authors."""

from __future__ import annotations

from .bisect import BisectResult, RewriteInfo, bisect
from .compare import Comparison, Divergence, NumericsError, compare_outputs, tolerance_for
from .inputs import sample_inputs_from_meta
from .invariants import (
    MetadataContractError,
    MetadataError,
    check_metadata,
    keeps_metadata,
    require_metadata,
)
from .layouts import LayoutError, check_layouts, require_layouts
from .numerics import NumericsCheck, PassNumerics, verify_numerics
from .streams import (
    StreamScheduleError,
    StreamViolation,
    check_streams,
    require_safe_streams,
)
from .testing import Captured, PassCheck, capture, check_pass, count_ops, op_counts

__all__ = [
    "BisectResult",
    "Captured",
    "Comparison",
    "Divergence",
    "LayoutError",
    "MetadataContractError",
    "MetadataError",
    "NumericsCheck",
    "NumericsError",
    "PassCheck",
    "PassNumerics",
    "RewriteInfo",
    "StreamScheduleError",
    "StreamViolation",
    "bisect",
    "capture",
    "check_layouts",
    "check_metadata",
    "check_pass",
    "check_streams",
    "compare_outputs",
    "count_ops",
    "keeps_metadata",
    "op_counts",
    "require_layouts",
    "require_metadata",
    "require_safe_streams",
    "sample_inputs_from_meta",
    "tolerance_for",
    "verify_numerics",
]
