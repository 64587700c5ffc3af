"""torch.fx's partitioning API, reimplemented: same names, signatures and results.

``CapabilityBasedPartitioner`` proposes exactly the partitions torch's does (same nodes, same
order, same ids) in linear instead of roughly cubic time — on graphs where torch's stale
reachability lets it propose partitions that cannot be fused (a dependency cycle between
them), fxpass's are cycle-free. ``fuse_by_partitions`` builds the same submodules (inputs in
first-use order, as torch's) and checks all partitions for cycles before changing the graph.
``get_source_partitions`` groups as torch's does, with its lists in graph order instead of set
order.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import fx, nn

from ..partition.base import Partition
from ..partition.capability import (
    DEFAULT_NON_COMPUTE_OPS,
    propose,
    remove_bookend_non_compute,
    torch_name_matcher,
)
from ..partition.fuse import fuse_partitions
from ..partition.source import (
    SourcePartition,
    check_subgraphs_connected,
    group_by_source,
    torch_keys,
)
from ..partition.support import OperatorSupportBase, any_chain, chain, node_support
from ..partition.support_dict import OperatorSupport, arg_dtype

__all__ = [
    "CapabilityBasedPartitioner",
    "OpSupports",
    "OperatorSupport",
    "OperatorSupportBase",
    "Partition",
    "SourcePartition",
    "any_chain",
    "chain",
    "check_subgraphs_connected",
    "create_op_support",
    "fuse_by_partitions",
    "get_source_partitions",
]

IsNodeSupported = Callable[[Mapping[str, nn.Module], fx.Node], bool]


def create_op_support(is_node_supported: IsNodeSupported) -> OperatorSupportBase:
    """Wrap ``is_node_supported(submodules, node)`` into a support object (torch's name)."""
    return node_support(is_node_supported, takes_submodules=True)


class OpSupports:
    """torch's ready-made support objects."""

    @classmethod
    def decline_if_input_dtype(cls, dtype: torch.dtype) -> OperatorSupportBase:
        """Not supported if any input has ``dtype``."""
        return create_op_support(
            lambda submodules, node: all(arg_dtype(a) != dtype for a in node.all_input_nodes)
        )

    @classmethod
    def decline_if_node_in_names(cls, disallow_set: set[str]) -> OperatorSupportBase:
        """Not supported if the node's name is in ``disallow_set``."""
        return create_op_support(lambda submodules, node: node.name not in disallow_set)


class CapabilityBasedPartitioner:
    """torch's ``CapabilityBasedPartitioner``, with a linear-time ``propose_partitions``."""

    def __init__(
        self,
        graph_module: fx.GraphModule,
        operator_support: Any,
        allows_single_node_partition: bool = False,
        non_compute_ops: Sequence[str] | None = None,
        allowed_single_node_partition_ops: Sequence[str] | None = None,
        skip_horizontal_fusion: bool = False,
    ) -> None:
        self.graph_module = graph_module
        self.operator_support = operator_support
        self.allows_single_node_partition = allows_single_node_partition
        self.non_compute_ops = non_compute_ops if non_compute_ops is not None else []
        self.allowed_single_node_partition_ops = (
            allowed_single_node_partition_ops
            if allowed_single_node_partition_ops is not None
            else []
        )
        self.skip_horizontal_fusion = skip_horizontal_fusion

    def propose_partitions(self) -> list[Partition]:
        """Partitions of supported nodes, as torch's partitioner proposes them."""
        submodules = dict(self.graph_module.named_modules())
        support = self.operator_support
        return propose(
            list(self.graph_module.graph.nodes),
            lambda node: bool(support.is_node_supported(submodules, node)),
            horizontal=not self.skip_horizontal_fusion,
            allows_single_node_partition=self.allows_single_node_partition,
            non_compute=torch_name_matcher({*DEFAULT_NON_COMPUTE_OPS, *self.non_compute_ops}),
            allowed_single=torch_name_matcher(self.allowed_single_node_partition_ops),
        )

    def fuse_partitions(
        self, partitions: list[Partition], prefix: str = "fused_"
    ) -> fx.GraphModule:
        """Replace each partition by a ``call_module`` of a new submodule."""
        return fuse_by_partitions(self.graph_module, [p.nodes for p in partitions], prefix=prefix)

    def remove_bookend_non_compute_ops(self, partitions: list[Partition]) -> None:
        """Drop ``non_compute_ops`` nodes at partition boundaries, in place."""
        remove_bookend_non_compute(partitions, torch_name_matcher(self.non_compute_ops))

    def partition_and_fuse(self, prefix: str = "fused_") -> fx.GraphModule:
        return self.fuse_partitions(self.propose_partitions(), prefix=prefix)


def fuse_by_partitions(
    gm: fx.GraphModule,
    partitions: list[dict[fx.Node, int | None]],
    prefix: str = "fused_",
    always_return_tuple: bool = False,
) -> fx.GraphModule:
    """torch's ``fuse_by_partitions``: partition ``i`` becomes submodule ``{prefix}{i}``.

    torch's ``OperatorSupport`` reports placeholders and the output as supported, so its
    partitions can hold them, and torch then fuses a graph's inputs or its return into a
    submodule, leaving a module that takes no inputs or returns nothing. Here such nodes stay
    where they are and only the nodes that compute are fused.
    """
    computing = [
        {n: v for n, v in nodes.items() if n.op not in ("placeholder", "output")}
        for nodes in partitions
    ]
    return fuse_partitions(
        gm,
        [nodes for nodes in computing if nodes],
        prefix=prefix,
        input_order="first_use",
        always_return_tuple=always_return_tuple,
    )


def get_source_partitions(
    graph: fx.Graph,
    wanted_sources: list[Any],
    filter_fn: Callable[[fx.Node], bool] | None = None,
) -> dict[Any, list[SourcePartition]]:
    """torch's ``get_source_partitions`` (lists in graph order)."""
    return group_by_source(graph, wanted_sources, filter_fn, torch_keys)
