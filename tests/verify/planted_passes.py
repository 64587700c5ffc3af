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


# ----- a bad edit planted inside a library pass ------------------------------------------------
# ``inplace_to_functional`` (a library pass, editing through the editor) replaces each in-place
# ``fxpass_planted::scale_`` by its functional twin ``fxpass_planted::scale``, found by name.
# The twin is wrong for one scale only, so exactly one of the pass's rewrites breaks numerics.
BAD_SCALE = 3.0


@torch.library.custom_op("fxpass_planted::scale_", mutates_args={"x"})
def _scale_(x: torch.Tensor, s: float) -> None:
    x.mul_(s)


@_scale_.register_fake
def _(x, s):
    return None


@torch.library.custom_op("fxpass_planted::scale", mutates_args=())
def _scale(x: torch.Tensor, s: float) -> torch.Tensor:
    return x * s + 1.0 if s == BAD_SCALE else x * s


@_scale.register_fake
def _(x, s):
    return torch.empty_like(x)


SCALES = (2.0, 2.0, BAD_SCALE, 2.0)


def scaled_in_place_graph() -> fx.GraphModule:
    """Four in-place scales of the graph's own tensors; the third is the one made wrong."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x):
        outs = []
        for s in SCALES:
            y = x * 1.5
            torch.ops.fxpass_planted.scale_(y, s)
            outs.append(y + 1)
        return tuple(outs)

    return make_fx(f)(torch.randn(4))
