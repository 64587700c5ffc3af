"""Partitioning: cut a graph into what a backend supports, and fuse the pieces.

* :mod:`~fxpass.partition.support` — operator support objects and what their specs mean;
* :mod:`~fxpass.partition.support_grammar` — the grammar of the support spec language;
* :mod:`~fxpass.partition.support_dict` — torch's operator-support dict;
* :mod:`~fxpass.partition.capability` — the largest cycle-free partitions of supported nodes
  (torch's ``CapabilityBasedPartitioner`` results, in linear time);
* :mod:`~fxpass.partition.from_patterns` — pattern matches and supported ops merged into partitions;
* :mod:`~fxpass.partition.source` — nodes grouped by the module or function they came from;
* :mod:`~fxpass.partition.fuse` — partitions into submodule or delegate calls, and back.
"""

from .base import Partition, find_cycle, is_cycle_free
from .capability import DEFAULT_NON_COMPUTE_OPS, capability_partitions
from .fuse import (
    FUSED_META,
    PartitionCycleError,
    call_delegate,
    fuse_partitions,
    fused_nodes,
    unfuse,
)
from .source import SourcePartition, check_subgraphs_connected, source_partitions
from .support import (
    NAMED_SUPPORTS,
    OperatorSupportBase,
    SupportSpecError,
    any_chain,
    chain,
    dtype_support,
    named_support,
    node_support,
    op_support,
    parse_support,
    shape_support,
)
from .support_dict import OperatorSupport

__all__ = [
    "DEFAULT_NON_COMPUTE_OPS",
    "FUSED_META",
    "NAMED_SUPPORTS",
    "OperatorSupport",
    "OperatorSupportBase",
    "Partition",
    "PartitionCycleError",
    "SourcePartition",
    "SupportSpecError",
    "any_chain",
    "call_delegate",
    "capability_partitions",
    "chain",
    "check_subgraphs_connected",
    "dtype_support",
    "find_cycle",
    "fuse_partitions",
    "fused_nodes",
    "generate_pattern_op_partitions",
    "graph_pattern",
    "is_cycle_free",
    "named_support",
    "node_support",
    "op_support",
    "parse_support",
    "pattern_matches",
    "pattern_partitions",
    "shape_support",
    "source_partitions",
    "unfuse",
]

_PATTERN_NAMES = (
    "generate_pattern_op_partitions",
    "graph_pattern",
    "pattern_matches",
    "pattern_partitions",
)


def __getattr__(name: str):
    # The pattern module needs the rewrite engine; load it only when asked for.
    if name in _PATTERN_NAMES:
        from . import from_patterns

        return getattr(from_patterns, name)
    raise AttributeError(f"module 'fxpass.partition' has no attribute {name!r}")
