"""Test-only passes with planted bugs, for bisection and the CLI's error paths.

``add_as_sub_neg`` rewrites every ``add(a, b)`` of two tensors as ``sub(a, neg(b))``; that is
correct everywhere except in the one place the bug is planted: the first such add inside
``layers.1`` loses its ``neg`` (``sub(a, b)``). The pass asks ``ctx.allow()`` before each
single rewrite and notifies each change, as the rewrite engine does, so bisection can stop
after the k-th rewrite.
"""

from __future__ import annotations

import torch
from torch import fx

from fxpass.core.context import ChangeEvent, current_context

aten = torch.ops.aten
RULE = "add_as_sub_neg"


def candidates(gm: fx.GraphModule) -> list[fx.Node]:
    """The adds the pass rewrites, in the order it rewrites them."""
    return [
        n
        for n in gm.graph.nodes
        if n.target is aten.add.Tensor and all(isinstance(a, fx.Node) for a in n.args[:2])
    ]


def planted_index(gm: fx.GraphModule) -> int:
    """1-based number of the rewrite that is wrong."""
    for i, node in enumerate(candidates(gm), 1):
        if _in_layer_1(node):
            return i
    raise AssertionError("the graph has no add inside layers.1")


def _in_layer_1(node: fx.Node) -> bool:
    stack = node.meta.get("nn_module_stack") or {}
    return any("layers.1" in str(path) for path, _ in stack.values())


def add_as_sub_neg(gm: fx.GraphModule) -> bool:
    """Rewrite add(a, b) as sub(a, neg(b)) -- with one planted wrong rewrite."""
    ctx = current_context()
    planted = False
    changed = False
    for node in candidates(gm):
        if ctx is not None and not ctx.allow():
            continue
        a, b = node.args[:2]
        wrong = not planted and _in_layer_1(node)
        planted |= wrong
        with gm.graph.inserting_before(node):
            if wrong:
                new = gm.graph.call_function(aten.sub.Tensor, (a, b))
                made = [new]
            else:
                neg = gm.graph.call_function(aten.neg.default, (b,))
                neg.meta["val"] = b.meta.get("val")
                new = gm.graph.call_function(aten.sub.Tensor, (a, neg))
                made = [neg, new]
        new.meta.update(node.meta)
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
        changed = True
        if ctx is not None:
            ctx.notify(ChangeEvent("replace", RULE, [node], made, location=f"{__file__}:60"))
    return changed


def explode(gm: fx.GraphModule) -> bool:
    """Break the graph, then raise: the pipeline must put the graph back."""
    for node in list(gm.graph.nodes):
        if node.op == "call_function":
            node.target = aten.sub.Tensor
            break
    raise RuntimeError("planted failure in explode")
