"""``cse``: common subexpression elimination over pure nodes, aware of mutation and RNG."""

from __future__ import annotations

import math
import operator
from typing import Any

import torch
from torch import fx

from ...core.analyses import aliasing, positions
from ...core.context import PassContext
from ...core.pass_registry import register
from ...edit.alias import AliasInfo, written_args
from ...fxutil.dialect import aten_op

__all__ = ["cse"]


class _Unhashable(Exception):
    pass


def _key_of(value: Any, rep: dict[fx.Node, fx.Node], info: AliasInfo, version: dict) -> Any:
    """A hashable key for an argument: nodes by representative and the version of their
    memory (a write in between makes two reads different), numbers by type and bits."""
    if isinstance(value, fx.Node):
        node = rep.get(value, value)
        return ("node", node, tuple(sorted(version.get(r, 0) for r in info.roots(node))))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_key_of(v, rep, info, version) for v in value))
    if isinstance(value, dict):
        return (
            "dict",
            tuple(sorted((k, _key_of(v, rep, info, version)) for k, v in value.items())),
        )
    if isinstance(value, float):
        return ("float", repr(value) if not math.isnan(value) else "nan")  # 0.0 != -0.0
    if isinstance(value, slice):
        return ("slice", _key_of((value.start, value.stop, value.step), rep, info, version))
    if isinstance(value, torch.Tensor):
        raise _Unhashable  # constant tensors: comparing them costs more than it saves
    try:
        hash(value)
    except TypeError:
        raise _Unhashable from None
    return (type(value).__name__, value)


_TORCH_MODULES = ("torch", "torch.functional", "torch.nn.functional", "torch._C._nn")
_RANDOM_WORDS = ("rand", "dropout", "bernoulli", "normal", "fractional", "multinomial")


def _deterministic_torch_call(node: fx.Node) -> bool:
    """A Python-level torch call (Dynamo, symbolic_trace) whose ATen namesake is pure and
    not random: ``torch.add``, ``x.mean``, ``F.silu``."""
    if node.op == "call_method":
        name = str(node.target)
    elif getattr(node.target, "__module__", None) in _TORCH_MODULES:
        name = getattr(node.target, "__name__", "")
    else:
        return False
    packet = getattr(torch.ops.aten, name, None) if name.isidentifier() else None
    if packet is None or name.endswith("_") or any(w in name for w in _RANDOM_WORDS):
        return False
    return not any(
        torch.Tag.nondeterministic_seeded in getattr(packet, o).tags for o in packet.overloads()
    )


def _python_operator(node: fx.Node) -> bool:
    target = node.target
    in_operator = getattr(target, "__module__", None) == "_operator"
    return node.op == "call_function" and (target is operator.getitem or in_operator)


def _candidate(node: fx.Node) -> bool:
    """Pure, deterministic, and not something whose identity matters."""
    if node.op == "get_attr":
        return True
    target = aten_op(node.target)  # Edge ops are ATen ops under another name
    if isinstance(target, torch._ops.OpOverload):
        if torch.Tag.nondeterministic_seeded in target.tags:
            return False  # two draws from a generator are two different values
    elif not (_python_operator(node) or _deterministic_torch_call(node)):
        return False  # HOPs, modules and unknown Python callables: effects unknown
    return not written_args(node) and not node.is_impure()


@register(
    "cse",
    origin="fxpass",
    statistics={"merged": "nodes replaced by an identical earlier node"},
    keeps="all",
    preserves=(positions, aliasing),
    edits="editor",
)
def cse(gm: fx.GraphModule, ctx: PassContext) -> bool:
    """Merge nodes that compute the same pure value from the same inputs.

    A node is merged into an earlier one with the same target, arguments and keyword
    arguments when both are pure: random ops (``rand``, ``dropout``, ``bernoulli`` ...)
    are never merged, nor ops that write memory, nor values whose memory is written
    anywhere in the graph (a later ``add_`` on one of them would show through the other).
    Reads of memory written in between are different values. ``-0.0`` and ``0.0`` differ.

    Before / after::

        %a = aten.mul(%x, 2)              %a = aten.mul(%x, 2)
        %b = aten.mul(%x, 2)      ->      %c = aten.add(%a, %a)
        %c = aten.add(%a, %b)
    """
    info, editor = aliasing(gm), ctx.editor
    written = frozenset().union(*info.written_by.values())
    version: dict[fx.Node, int] = {}
    seen: dict[Any, fx.Node] = {}
    rep: dict[fx.Node, fx.Node] = {}
    changed = False
    for node in list(gm.graph.nodes):
        for root in info.written_by.get(node, ()):
            version[root] = version.get(root, 0) + 1
        if not _candidate(node) or info.roots(node) & written:
            continue
        try:
            key = (node.op, node.target, _key_of(node.args, rep, info, version))
            key += (_key_of(node.kwargs, rep, info, version),)
        except _Unhashable:
            continue
        first = seen.get(key)
        if first is None:
            seen[key] = node
        elif editor.allow():
            rep[node] = first
            editor.replace_all_uses(node, first, "cse")
            ctx.stat("merged")
            changed = True
    return changed
