"""Which nodes Inductor's pattern matcher leaves alone: mutating ops (a match may not span
one) and nodes it would not lower (``fallback_node_due_to_unsupported_type``)."""

from __future__ import annotations

import re
from typing import Any

import torch
from torch._higher_order_ops.auto_functionalize import AutoFunctionalized
from torch.fx import Node

__all__ = ["is_mutation_op", "unsupported_node"]

# copy_, relu_, _set_grad_enabled, manual_seed, _enter_autocast... (not __rshift__)
_MUTATING_NAME = re.compile(r"(?<!_)(_$|_[.]|(\b|_)(set|enter|exit|seed)(\b|_))(?!_)")
_BY_TARGET: dict[int, tuple[Any, bool | None]] = {}  # id(target) -> (target, verdict)


def _target_verdict(node: Node) -> bool | None:
    """True/False when the target decides; None when an ``out=`` argument decides."""
    t = node.target
    # inductor::resize_storage_bytes_ has a functional schema; its name says what it does
    if isinstance(t, torch._ops.OpOverload) and str(t) != "inductor.resize_storage_bytes_.default":
        return t._schema.is_mutable
    if isinstance(t, AutoFunctionalized):
        return False
    name = t if node.op == "call_method" else getattr(t, "__name__", "")
    if node.op in ("call_function", "call_method") and _MUTATING_NAME.search(str(name)):
        return True
    return None


def is_mutation_op(node: Node) -> bool:
    """Inductor's rule: a mutable op schema, a mutating name (``relu_``, ``manual_seed``),
    or an ``out=`` argument."""
    if node.op not in ("call_function", "call_method"):
        return node.kwargs.get("out") is not None
    hit = _BY_TARGET.get(id(node.target))
    if hit is None or hit[0] is not node.target:
        hit = _BY_TARGET[id(node.target)] = (node.target, _target_verdict(node))
    verdict = hit[1]
    if verdict is not None:
        return verdict
    return node.kwargs.get("out") is not None


def _on_meta(node: Node) -> bool:
    vals = [node.meta.get("val")] + [a.meta.get("val") for a in node.all_input_nodes]
    return any(isinstance(v, torch.Tensor) and v.is_meta for v in vals)


def _kind(val: Any) -> Any:
    if isinstance(val, torch.Tensor):
        return (val.dtype, val.device.type, val.layout, type(val).__name__)
    if isinstance(val, (list, tuple)):
        return tuple(_kind(v) for v in val)
    return type(val).__name__


_VERDICTS: dict[tuple, tuple[Any, bool]] = {}


def unsupported_node(node: Node, *, allow_meta: bool = False, cpp: Any = None) -> bool:
    """Whether Inductor's pattern matcher skips ``node`` (it would not lower it: complex,
    sparse or meta tensors, unsupported float8 types). ``allow_meta``: not for meta tensors.

    Inductor's own check (``torch._inductor.lowering.fallback_node_due_to_unsupported_type``,
    looked up each time, so a client's patch of it applies) decides; its verdict depends on
    the op and the dtypes, devices and layouts of the node's values, and is remembered by
    them (asking costs a fake-tensor dispatch per value). ``cpp``: Inductor's
    ``disable_cpp_codegen`` setting, if the caller read it already."""
    if allow_meta and _on_meta(node):
        return False
    from torch._inductor import lowering

    if cpp is None:
        from torch._inductor import config

        cpp = config.disable_cpp_codegen
    check = lowering.fallback_node_due_to_unsupported_type
    key = (
        id(check),
        node.op,
        id(node.target),
        cpp,
        _kind(node.meta.get("val")),
        tuple(_kind(a.meta.get("val")) for a in node.all_input_nodes),
    )
    hit = _VERDICTS.get(key)
    if hit is None or hit[0] is not node.target:
        if len(_VERDICTS) > 4096:
            _VERDICTS.clear()
        hit = _VERDICTS[key] = (node.target, bool(check(node, allow_cpu_inputs=False)))
    return hit[1]
