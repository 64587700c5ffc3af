"""How new nodes call ops: the one node writer, for every graph form.

A graph's form (:mod:`fxpass.fxutil.graph_forms`) decides how its new nodes spell an op: in
the torch and ATen forms as the op itself, in an ExecuTorch Edge graph as the Edge op
(casts and clones as ExecuTorch's dim-order ops where the graph uses them). Passes ask a
:class:`Spelling` before they create a node; the rewriter asks it to respell the nodes a
replacement created (:meth:`Spelling.respell`). No other module writes Edge ops.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import fx

from ..fxutil.dialect import edge_call, graph_is_edge, uses_dim_order

__all__ = ["Spelling"]


class Spelling:
    """How the new nodes of one graph call ops: in an ExecuTorch Edge graph, Edge ops (casts
    and clones as ExecuTorch's dim-order ops where the graph uses them); elsewhere the op.
    ``edge`` says the graph's form when the caller knows it (else it is read from the graph).

    >>> target, args, kwargs = Spelling(gm.graph)(aten.clone.default, (x,), {})  # doctest: +SKIP
    """

    def __init__(self, graph: fx.Graph, *, edge: bool | None = None) -> None:
        self.edge = graph_is_edge(graph.nodes) if edge is None else edge
        self.dim_order = self.edge and uses_dim_order(graph.nodes)

    def __call__(self, op: Any, args: tuple = (), kwargs: dict | None = None):
        kwargs = dict(kwargs or {})
        if not self.edge:
            return op, args, kwargs
        return edge_call(op, args, kwargs, dim_order=self.dim_order)

    def respell(self, nodes: Iterable[fx.Node], editor: Any, rule: str) -> None:
        """Make ``nodes`` (created in this graph's ATen spelling, a traced replacement's)
        call ops as this graph does, through ``editor`` (an :class:`~fxpass.edit.Editor`):
        in an Edge graph, ATen ops become Edge ops and a fused op wears the Edge wrapper of
        the same ``torch.ops.fxpass`` op (ExecuTorch's Edge verifier asks every op to be an
        Edge op); an op with no Edge spelling is left for that verifier to name."""
        if not self.edge:
            return
        for n in nodes:
            if n.op != "call_function" or not isinstance(n.target, torch._ops.OpOverload):
                continue
            try:
                target, _, kwargs = edge_call(n.target, n.args, n.kwargs, dim_order=self.dim_order)
            except AttributeError:  # no Edge spelling: leave it, ExecuTorch's verifier says so
                continue
            changed = kwargs if kwargs is not n.kwargs else None
            editor.set_target(n, target, kwargs=changed, rule=rule)
