"""``partition``: cut the graph into what a backend supports, and fuse each piece.

The last step of a lowering pipeline for a backend that runs only some ops: the supported
nodes are grouped into the largest cycle-free partitions
(:func:`~fxpass.partition.capability_partitions`) and each partition becomes one call of a
submodule (:func:`~fxpass.partition.fuse_partitions`), called as the graph's IR allows
(``call_module``, or ``invoke_subgraph`` in an exported program)::

    fxpass.Pipeline.parse('remove_assert_ops,partition{support="elementwise | norm"}')

Before / after (``support="elementwise"``)::

    %mm  = aten.mm(%x, %w)                    %mm = aten.mm(%x, %w)
    %add = aten.add.Tensor(%mm, %b)     ->    %fused_0 = call_module[fused_0](%b, %mm)
    %relu = aten.relu(%add)                   return (%fused_0,)
    return (%relu,)
"""

from __future__ import annotations

from typing import Literal

from torch import fx

from ..core.context import PassContext
from ..core.pass_registry import register
from ..fxutil.fx_internals import is_exported_graph
from ..partition.capability import capability_partitions
from ..partition.fuse import FUSED_META, fuse_partitions, fused_nodes

__all__ = ["partition"]


@register(
    "partition",
    origin="fxpass",
    statistics={
        "partitions": "partitions fused into one call each",
        "nodes": "nodes moved into the fused submodules",
    },
    # the calls and their getitems: provenance naming what they replaced, the stack traces
    # of the nodes moved (a value or module stack for the call is not always there to keep)
    keeps=("stack_trace", "provenance"),
)
def partition(
    gm: fx.GraphModule,
    ctx: PassContext,
    *,
    support: str,
    allows_single_node_partition: bool = False,
    non_compute_ops: list[str] | None = None,
    allowed_single_node_partition_ops: list[str] | None = None,
    horizontal: bool = True,
    mode: Literal["auto", "module", "delegate"] = "auto",
    prefix: str = "fused_",
) -> bool:
    """Fuse the largest cycle-free partitions of supported ops into submodule calls.

    ``support`` is an operator-support spec (``"elementwise | norm"``,
    ``"ops(aten.mm, aten.add) & dtype(bf16)"``; see :func:`fxpass.partition.parse_support`).
    The other options are :func:`~fxpass.partition.capability_partitions`'s, plus ``mode``:
    ``module`` (``call_module``), ``delegate`` (``invoke_subgraph`` on a ``get_attr``, what
    an exported program's IR allows: it has no ``call_module``) or ``auto`` (the default:
    ``delegate`` on an exported program or ``.pt2`` file, else ``module``), and ``prefix``
    for the new submodules' names. Statistics: ``partitions`` fused and ``nodes`` moved into
    them.
    """
    if mode == "auto":
        mode = "delegate" if is_exported_graph(gm) else "module"
    parts = capability_partitions(
        gm,
        support,
        allows_single_node_partition=allows_single_node_partition,
        non_compute_ops=non_compute_ops,
        allowed_single_node_partition_ops=allowed_single_node_partition_ops,
        horizontal=horizontal,
    )
    before = set(fused_nodes(gm))
    # fuse_partitions asks the debug counter before each fusion and tells the run about it
    fuse_partitions(gm, parts, prefix=prefix, mode=mode, recompile=False, editor=ctx.editor)
    calls = [call for call in fused_nodes(gm) if call not in before]
    if not calls:
        return False
    ctx.stat("partitions", len(calls))
    ctx.stat("nodes", sum(len(call.meta[FUSED_META]["nodes"]) for call in calls))
    gm.recompile()
    return True
