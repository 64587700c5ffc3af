"""How the new nodes of one graph call ops (the dialect they are written in)."""

from __future__ import annotations

from typing import Any

from torch import fx

from ..fxutil.dialect import edge_call, graph_is_edge, uses_dim_order

__all__ = ["Spelling"]


class Spelling:
    """How the new nodes of one graph call ops: in an ExecuTorch Edge graph, Edge ops (casts
    and clones as ExecuTorch's dim-order ops where the graph uses them); elsewhere the op.

    >>> target, args, kwargs = Spelling(gm.graph)(aten.clone.default, (x,), {})  # doctest: +SKIP
    """

    def __init__(self, graph: fx.Graph) -> None:
        self.edge = graph_is_edge(graph.nodes)
        self.dim_order = self.edge and uses_dim_order(graph.nodes)

    def __call__(self, op: Any, args: tuple = (), kwargs: dict | None = None):
        kwargs = dict(kwargs or {})
        if not self.edge:
            return op, args, kwargs
        return edge_call(op, args, kwargs, dim_order=self.dim_order)
