"""Op resolution: from the names users write (``aten.add.Tensor``, ``aten.add``,
``fxpass.rms_norm``, ``operator.getitem``, ``torch.nn.functional.linear``, an Edge op's
``exir_ops.edge.aten.add.Tensor``) to the op objects graphs call, and back."""

from __future__ import annotations

import difflib
import importlib
import operator
from collections.abc import Iterable
from typing import Any

import torch

from .paths import find_path

__all__ = [
    "CONVERSION_OPS",
    "NORM_OPS",
    "VIEW_OPS",
    "existing_ops",
    "fxpass_norm_ops",
    "op_name",
    "op_registrar",
    "resolve_op",
    "torch_op",
]

_OP_PREFIXES = (
    "torch.ops.",
    "executorch.exir.dialects.edge._ops.",  # an Edge op's qualified name
    "exir_ops.edge.",
    "edge.",
)


def resolve_op(name: str) -> Any:
    """Turn an op name into the op: ``aten.add.Tensor`` (an overload), ``aten.add`` (every
    overload), ``fxpass.rms_norm``, ``operator.getitem`` / ``getitem``, or an importable
    dotted path such as ``torch.nn.functional.linear`` or ``torch.nn.Linear``. An Edge op's
    name (``exir_ops.edge.aten.add.Tensor``, ``edge.aten.add``) gives the ATen op."""
    text = name.strip()
    for prefix in _OP_PREFIXES:  # Edge ops are written as the ATen ops they wrap
        if text.startswith(prefix):
            text = text[len(prefix) :]
            break
    if text in ("getitem", "_operator.getitem"):
        return operator.getitem
    parts = text.split(".")
    if len(parts) in (2, 3) and parts[0] not in ("torch", "operator", "math", "builtins"):
        op = torch_op(parts)
        if op is not None:
            return op
    obj = _import_path(text)
    if obj is None:
        raise ValueError(_unknown_op(name))
    return obj


def torch_op(parts: list[str]) -> Any:
    """``torch.ops.<namespace>.<name>[.<overload>]`` for the split name, or None."""
    namespace = getattr(torch.ops, parts[0], None)
    if namespace is None:
        return None
    try:
        packet = getattr(namespace, parts[1])
        return getattr(packet, parts[2]) if len(parts) == 3 else packet
    except (AttributeError, RuntimeError):
        return None


def _import_path(text: str) -> Any:
    module, _, attr = text.rpartition(".")
    while module:
        try:
            obj = importlib.import_module(module)
        except ImportError:
            module, _, head = module.rpartition(".")
            attr = f"{head}.{attr}"
            continue
        return find_path(obj, attr)
    return None


def _unknown_op(name: str) -> str:
    parts = name.replace("torch.ops.", "").split(".")
    hint = ""
    if len(parts) >= 2 and parts[0] == "aten":
        names = [n for n in dir(torch.ops.aten) if not n.startswith("_")]
        close = difflib.get_close_matches(parts[1], names, n=3)
        if close:
            hint = "; did you mean " + ", ".join(f"aten.{c}" for c in close) + "?"
    return (
        f"unknown op '{name}'{hint} (write an overload like aten.add.Tensor, a packet like "
        "aten.add, operator.getitem, or an importable path like torch.nn.functional.linear)"
    )


def op_name(op: Any) -> str:
    """The name :func:`resolve_op` reads back: ``aten.add.Tensor``, ``operator.getitem``."""
    if isinstance(op, torch._ops.OpOverload):
        return f"{op.namespace}.{op._schema.name.split('::')[-1]}.{op._overloadname}"
    if isinstance(op, torch._ops.OpOverloadPacket):
        return f"{op._qualified_op_name.replace('::', '.')}"
    if op is operator.getitem:
        return "operator.getitem"
    module = getattr(op, "__module__", None) or ""
    return f"{module}.{getattr(op, '__qualname__', getattr(op, '__name__', repr(op)))}".lstrip(".")


#: Names of the ATen packets that convert dtypes (what ``elementwise`` adds to pointwise ops).
CONVERSION_OPS = ("aten._to_copy", "aten.to", "aten.type_as", "aten._to_dtype", "aten.clone")
#: Names of the ATen packets norms decompose to or are.
NORM_OPS = (
    "aten.mean",
    "aten.var",
    "aten.var_mean",
    "aten.native_layer_norm",
    "aten.layer_norm",
    "aten.native_group_norm",
    "aten.native_batch_norm",
    "aten._native_batch_norm_legit_no_training",
    "aten.rms_norm",
    "aten._fused_rms_norm",
)
_FXPASS_NORMS = ("rms_norm", "fused_add_rmsnorm", "fused_add_rmsnorm_quant")
#: Names of the view-like ATen packets (and ``operator.getitem``).
VIEW_OPS = (
    "aten.view",
    "aten._unsafe_view",
    "aten.reshape",
    "aten.permute",
    "aten.transpose",
    "aten.t",
    "aten.expand",
    "aten.unsqueeze",
    "aten.squeeze",
    "aten.slice",
    "aten.select",
    "aten.alias",
    "aten.as_strided",
    "aten.split",
    "aten.split_with_sizes",
    "operator.getitem",
)


def existing_ops(names: Iterable[str]) -> list[Any]:
    """The ops among ``names`` this torch has (names it lacks are skipped)."""
    out = []
    for name in names:
        parts = name.split(".")
        op = operator.getitem if name == "operator.getitem" else torch_op(parts)
        if op is not None:
            out.append(op)
    return out


def fxpass_norm_ops() -> list[Any]:
    """fxpass's norm ops that are registered (this module imports no fxpass code)."""
    ns = getattr(torch.ops, "fxpass", None)
    out = []
    for name in _FXPASS_NORMS:
        try:
            out.append(getattr(ns, name))
        except (AttributeError, RuntimeError):
            continue
    return out


def op_registrar(op: Any) -> str | None:
    """The Python module that defined the custom op ``op`` (an OpOverload) with
    ``torch.library.custom_op`` (``fxpass::rms_norm`` -> ``fxpass.ops.norm``), or None
    (an op of torch's, or one a C++ library registers)."""
    from torch._library.custom_ops import _maybe_get_opdef

    name = getattr(op, "_schema", None)
    opdef = _maybe_get_opdef(name.name) if name is not None else None
    init = getattr(opdef, "_init_fn", None)
    return getattr(init, "__module__", None)
