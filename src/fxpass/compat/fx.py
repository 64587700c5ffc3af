"""fxpass's versions of torch.fx's pass, rewrite and partition APIs, under torch's names.

Change ``from torch.fx.passes.infra.pass_manager import PassManager`` to
``from fxpass.compat.fx import PassManager`` (and likewise for the other names) and existing
code runs unchanged, with fxpass's rollback on failure, one recompile per run and honest
"modified" results.
"""

from ._partition import (
    CapabilityBasedPartitioner,
    OperatorSupport,
    OperatorSupportBase,
    OpSupports,
    Partition,
    SourcePartition,
    any_chain,
    chain,
    check_subgraphs_connected,
    create_op_support,
    fuse_by_partitions,
    get_source_partitions,
)
from ._pass_infra import (
    PassBase,
    PassManager,
    PassResult,
    _topological_sort_passes,
    pass_result_wrapper,
    this_before_that_pass_constraint,
)
from ._replace import Match, ReplacedPatterns, replace_pattern, replace_pattern_with_filters
from ._subgraph import InternalMatch, SubgraphMatcher, SubgraphMatcherWithNameNodeMap

__all__ = [
    "CapabilityBasedPartitioner",
    "InternalMatch",
    "Match",
    "OpSupports",
    "OperatorSupport",
    "OperatorSupportBase",
    "Partition",
    "PassBase",
    "PassManager",
    "PassResult",
    "ReplacedPatterns",
    "SourcePartition",
    "SubgraphMatcher",
    "SubgraphMatcherWithNameNodeMap",
    "_topological_sort_passes",
    "any_chain",
    "chain",
    "check_subgraphs_connected",
    "create_op_support",
    "fuse_by_partitions",
    "get_source_partitions",
    "pass_result_wrapper",
    "replace_pattern",
    "replace_pattern_with_filters",
    "this_before_that_pass_constraint",
]
