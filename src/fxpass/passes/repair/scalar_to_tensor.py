"""``scalar_to_tensor``: Python numbers in ops' tensor arguments become 0-d tensors."""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import fx

from ...core.context import PassContext
from ...core.pass_registry import register
from ...edit.alias import lay_out_args
from ...edit.dialect_writer import Spelling
from ...fxutil.dialect import aten_op
from ...fxutil.ops import schema_of
from ...fxutil.values import fake_value, node_val

__all__ = ["scalar_to_tensor"]

_NAME = "scalar_to_tensor"
_NUMBER = (bool, int, float)
_SCALAR_TO_TENSOR = {("Scalar", "Tensor"), ("number", "Tensor")}  # how schemas print Scalar


def _tensor_overload(op: torch._ops.OpOverload) -> torch._ops.OpOverload | None:
    """The overload of ``op`` that takes tensors where ``op`` takes Scalars (``add.Scalar``
    -> ``add.Tensor``, ``pow.Tensor_Scalar`` -> ``pow.Tensor_Tensor``), else None."""
    # cached per op and the overloads its packet has now (a library may define more later)
    return _tensor_overload_among(op, tuple(op.overloadpacket.overloads()))


@functools.cache
def _tensor_overload_among(
    op: torch._ops.OpOverload, names: tuple[str, ...]
) -> torch._ops.OpOverload | None:
    args = schema_of(op).arguments
    packet = op.overloadpacket
    for name in names:
        other = getattr(packet, name)
        theirs = schema_of(other).arguments
        if other is op or len(theirs) != len(args) or schema_of(other).is_mutable:
            continue
        fits = all(
            a.name == b.name
            and (str(a.type) == str(b.type) or (str(a.type), str(b.type)) in _SCALAR_TO_TENSOR)
            for a, b in zip(args, theirs)
        )
        if fits and len(schema_of(other).returns) == len(schema_of(op).returns):
            return other
    return None


def _scalar_dtype(like: torch.Tensor, value: Any) -> torch.dtype:
    """The dtype for ``value`` as a 0-d tensor next to ``like``: what promotion gives, but
    at least float32 for floats (a bf16 ``1e-6`` would round; the kernels compute a scalar
    operand in float32 anyway)."""
    dtype = torch.result_type(like, value)
    if dtype.is_floating_point and dtype.itemsize < 4:
        return torch.float32
    return dtype


def _bind(node: fx.Node, old: torch.FunctionSchema, new: torch.FunctionSchema):
    """The node's arguments by name (from ``old``), laid out as ``new`` takes them."""
    values = {}
    for i, arg in enumerate(old.arguments):
        if i < len(node.args) and not arg.kwarg_only:
            values[arg.name] = node.args[i]
        elif arg.name in node.kwargs:
            values[arg.name] = node.kwargs[arg.name]
    return lay_out_args(new, values)


def _numbers(target: torch._ops.OpOverload, args: list, kwargs: dict) -> list[str]:
    """The ``Tensor`` arguments of ``target`` that ``args`` / ``kwargs`` pass numbers in."""
    named = dict(zip((a.name for a in schema_of(target).arguments), args)) | kwargs
    return [
        a.name
        for a in schema_of(target).arguments
        if str(a.type) == "Tensor" and isinstance(named.get(a.name), _NUMBER)
    ]


def _convert(
    node: fx.Node,
    target: torch._ops.OpOverload,
    args: list,
    kwargs: dict,
    names: list[str],
    spell: Spelling,
    ctx: PassContext,
) -> bool:
    """Call ``target`` with ``args`` / ``kwargs`` (laid out for it, changed in place here),
    numbers ``names`` made 0-d tensors, unless that changes the result's shape or dtype."""
    editor = ctx.editor
    like = next(
        (node_val(a) for a in node.all_input_nodes if isinstance(node_val(a), torch.Tensor)),
        None,
    )
    if like is None:
        return False
    positions = {a.name: i for i, a in enumerate(schema_of(target).arguments)}
    with editor.change("modify", _NAME, [node]) as change:
        made = []
        for name in names:
            i = positions[name]
            value = args[i] if i < len(args) else kwargs[name]
            made_kwargs = {"dtype": _scalar_dtype(like, value), "device": like.device}
            scalar = editor.insert(
                *spell(torch.ops.aten.scalar_tensor.default, (value,), made_kwargs),
                rule=_NAME,
                origin=[node],
                before=node,
            )
            scalar.meta["val"] = fake_value(scalar.target, scalar.args, scalar.kwargs, like=like)
            made.append(scalar)
            if i < len(args):
                args[i] = scalar
            else:
                kwargs[name] = scalar
        old, new = node_val(node), fake_value(target, tuple(args), kwargs)
        same = isinstance(new, torch.Tensor) and isinstance(old, torch.Tensor)
        if not (same and (new.shape, new.dtype) == (old.shape, old.dtype)):
            for scalar in made:  # promotion would change the result: undo, and tell nobody
                editor.erase(scalar, _NAME)
            change.cancel()
            return False
        target, args, kwargs = spell(target, tuple(args), kwargs)
        editor.set_target(node, target, args=args, kwargs=kwargs, rule=_NAME)
        change.new = [*made, node]
    ctx.stat("scalars_converted", len(made))
    return True


@register(
    "scalar_to_tensor",
    origin="fxpass",
    statistics={
        "scalars_converted": "numbers replaced by 0-d tensors",
        "overloads_switched": "Scalar overloads replaced by their Tensor overload",
    },
    keeps=("val", "stack_trace", "nn_module_stack", "provenance"),
)
def scalar_to_tensor(
    gm: fx.GraphModule, ctx: PassContext, *, switch_overloads: bool = True
) -> bool:
    """Turn Python numbers passed to ops as tensors into 0-d tensors (ExecuTorch's
    ``ScalarToTensorPass``), for backends whose kernels take only tensors.

    A number in a ``Tensor`` argument (export writes ``aten.mul.Tensor(%x, 0.5)``) becomes
    an ``aten.scalar_tensor`` node. With ``switch_overloads`` (the default), ops with a
    tensor overload switch to it (``add.Scalar`` -> ``add.Tensor``, ``pow.Tensor_Scalar``
    -> ``pow.Tensor_Tensor``). The 0-d tensor's dtype keeps the op's result dtype (floats
    are at least float32, so ``1e-6`` does not round to bf16); a rewrite that would change
    the result's dtype or shape is not made. Only ATen-level graphs (export, AOT).

    Before / after::

        %mul = aten.mul.Tensor(%x, 0.5)    ->     %scalar_tensor = aten.scalar_tensor(0.5, dtype=torch.float32)
                                                  %mul = aten.mul.Tensor(%x, %scalar_tensor)
    """
    changed, editor = False, ctx.editor
    spell = Spelling(gm.graph)  # an Edge graph keeps Edge ops
    for node in list(gm.graph.nodes):
        if node.op != "call_function":
            continue
        target = original = aten_op(node.target)
        if not isinstance(target, torch._ops.OpOverload):
            continue
        if switch_overloads:
            target = _tensor_overload(target) or target
        args, kwargs = _bind(node, schema_of(original), schema_of(target))
        names = _numbers(target, args, kwargs)
        if names and editor.allow() and _convert(node, target, args, kwargs, names, spell, ctx):
            if target is not original:
                ctx.stat("overloads_switched")
            changed = True
    return changed
