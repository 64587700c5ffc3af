"""``lower_fused_ops``: replace every ``fxpass::`` op with its decomposition in torch's ops.

What ``fxpass run --portable`` (``fxpass.apply(..., portable=True)``) runs last, so the
program it writes loads and runs where fxpass is not installed. Each call is replaced by its
op's decomposition (:mod:`fxpass.ops.portable`), traced into ATen ops on the call's fake
values; the new nodes carry ``meta['val']``, the call's source metadata and provenance.

Before / after::

    %rms = fxpass.rms_norm(%x, %w, 1e-06, 0.0)          %pow = aten.pow.Tensor_Scalar(%x, 2)
                                                        %mean = aten.mean.dim(%pow, [-1], True)
                                              ->        %add = aten.add.Tensor(%mean, 1e-06)
                                                        %rsqrt = aten.rsqrt.default(%add)
                                                        %mul = aten.mul.Tensor(%x, %rsqrt)
                                                        %rms = aten.mul.Tensor(%mul, %w)

An ``fxpass::`` op without a decomposition (the stream ops) fails the pass with the op's
name; the graph is left as it was.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch import fx
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils import _pytree as pytree

from ..core.context import PassContext
from ..core.errors import FxpassError
from ..core.pass_registry import register
from ..edit.editor import Editor
from ..ops.portable import decomposition

__all__ = ["lower_fused_ops"]

_RULE = "lower_fused_ops"


def _is_fxpass_op(node: fx.Node) -> bool:
    return (
        node.op == "call_function"
        and isinstance(node.target, torch._ops.OpOverload)
        and (node.target.namespace == "fxpass")
    )


@register(
    "lower_fused_ops",
    origin="fxpass",
    statistics={"lowered": "fxpass:: op calls replaced by torch's own ops"},
    keeps=("val", "stack_trace", "nn_module_stack", "provenance"),
)
def lower_fused_ops(gm: fx.GraphModule, ctx: PassContext) -> bool:
    """Replace every ``torch.ops.fxpass`` call with its decomposition into torch's own ops,
    so the program runs where fxpass is not installed (``fxpass run --portable``)."""
    calls = [n for n in gm.graph.nodes if _is_fxpass_op(n)]
    missing = sorted({str(n.target) for n in calls if decomposition(n.target) is None})
    if missing:
        raise FxpassError(
            f"{', '.join(missing)} ha{'ve' if len(missing) > 1 else 's'} no decomposition into "
            "torch's own ops, so this program cannot be written without fxpass's ops; "
            "leave out --portable (the program then loads where fxpass is installed)"
        )
    editor = ctx.editor
    changed = False
    for node in calls:
        if not editor.allow():
            continue
        _lower(node, editor)
        ctx.stat("lowered")
        changed = True
    return changed


def _val(a: Any) -> Any:
    if isinstance(a, fx.Node):
        if "val" not in a.meta:
            raise FxpassError(f"%{a.name} has no meta['val']: cannot trace the decomposition")
        return a.meta["val"]
    return a


def _trace(node: fx.Node) -> tuple[fx.GraphModule, list[fx.Node]]:
    """The decomposition traced into ATen on the call's fake values; the call's node
    arguments, one per placeholder of the traced graph."""
    fn = decomposition(node.target)
    flat, spec = pytree.tree_flatten((node.args, node.kwargs))
    where = [i for i, a in enumerate(flat) if isinstance(a, fx.Node)]

    def call(*tensors: Any) -> Any:
        values = list(flat)
        for i, t in zip(where, tensors):
            values[i] = t
        args, kwargs = pytree.tree_unflatten(values, spec)
        return fn(*args, **kwargs)

    vals = [_val(flat[i]) for i in where]
    fake_mode = torch._guards.detect_fake_mode(vals)
    with fake_mode if fake_mode is not None else torch._C._DisableTorchDispatch():
        traced = make_fx(call, tracing_mode="real" if fake_mode is not None else "fake")(*vals)
    return traced, [flat[i] for i in where]


def _lower(node: fx.Node, editor: Editor) -> None:
    traced, inputs = _trace(node)
    env: dict[fx.Node, Any] = {}
    placeholders = [n for n in traced.graph.nodes if n.op == "placeholder"]
    env.update(zip(placeholders, inputs))
    for t in traced.graph.nodes:
        if t.op in ("placeholder", "output"):
            continue
        env[t] = editor.insert(
            t.target,
            fx.node.map_arg(t.args, env.__getitem__),
            fx.node.map_arg(t.kwargs, env.__getitem__),
            rule=_RULE,
            origin=[node],
            before=node,
            val=t.meta.get("val"),
        )
    result = fx.node.map_arg(traced.graph.output_node().args[0], env.__getitem__)
    if isinstance(result, (tuple, list)):
        for user in list(node.users):
            if user.target is operator.getitem and isinstance(result[user.args[1]], fx.Node):
                editor.replace_all_uses(user, result[user.args[1]], _RULE)
    elif isinstance(result, fx.Node):
        editor.replace_all_uses(node, result, _RULE, erase_old=False)
    if not node.users:
        editor.erase(node, _RULE)
