"""Helpers the cleanup-pass tests share."""

from __future__ import annotations

from torch import fx


def calls(gm: fx.GraphModule, name: str) -> int:
    """How many call_function/call_method nodes are called ``name`` (method or op name,
    e.g. ``"add_"`` matches ``x.add_`` and ``aten.add_.Tensor``)."""
    total = 0
    for n in gm.graph.nodes:
        if n.op == "call_method" and n.target == name:
            total += 1
        elif n.op == "call_function":
            text = getattr(n.target, "__name__", str(n.target))
            if text.split(".")[0] == name:
                total += 1
    return total
