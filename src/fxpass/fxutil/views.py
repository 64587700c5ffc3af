"""View ops, their ``*_copy`` variants, and which shape-only ops keep a tensor's rows.

Functionalized graphs (ExecuTorch's Edge dialect, ``run_decompositions`` with a functional
table) spell every view as a copy: ``view_copy``, ``permute_copy``, ``expand_copy``,
``unsqueeze_copy``... The pairs are not a hand-kept list: they are read off torch's
registered ops (``aten::X_copy.overload`` whose ``aten::X.overload`` returns an alias of its
input).

>>> copy_variant(torch.ops.aten.view.default)
<OpOverload(op='aten.view_copy', overload='default')>
>>> view_variant(torch.ops.aten.permute_copy.default)
<OpOverload(op='aten.permute', overload='default')>

:func:`keeps_rows` answers the question a row-wise op (a norm or softmax over the last
dimension) asks of a shape-only op between it and its input: does every row of the result
(its values along the last dimension) equal a row of the input? Then the row-wise op
commutes with it: ``norm(view(x)) == view(norm(x))``.

:func:`returns_view` answers what a multi-stream schedule asks of ``reshape``, ``flatten``,
``contiguous``, ``to``, ``view_as``...: their schemas say the result *may* alias the input,
but whether it does depends on the input's layout. torch's own kernels decide, run on meta
tensors laid out like the example values (no data, a few microseconds, cached):

>>> x = torch.empty(2, 4, 1, 8).expand(2, 4, 3, 8)           # stride 0: a broadcast
>>> returns_view(torch.ops.aten.reshape.default, (x, [2, 12, 8]))   # must copy
False
>>> returns_view(torch.ops.aten.reshape.default, (torch.empty(2, 4, 8), [8, 8]))
True
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import fx

from .dialect import aten_op

__all__ = [
    "always_view",
    "copy_variant",
    "keeps_rows",
    "returns_view",
    "shares_storage",
    "view_base_name",
    "view_variant",
]

aten = torch.ops.aten

# shape-only ops by base name (ATen op name without ``_copy``, or the Python method name)
# row-major reshapes: rows survive whenever the last dimension keeps its size
_RESHAPES = frozenset(
    ["view", "reshape", "_unsafe_view", "flatten", "unflatten", "view_as", "reshape_as"]
) | frozenset(["squeeze", "unsqueeze", "_reshape_copy"])
_IDENTITIES = frozenset(["alias", "clone", "contiguous", "detach", "lift_fresh"])
_EXPANDS = frozenset(["expand", "expand_as"])
_PERMUTES = frozenset(["permute"])
_TRANSPOSES = frozenset(["transpose", "swapaxes", "swapdims"])
_SLICES = frozenset(["slice", "narrow", "select"])  # (x, dim, ...): rows when dim is not last
_ROW_KEEPERS = _RESHAPES | _IDENTITIES | _EXPANDS | _PERMUTES | _TRANSPOSES | _SLICES


def _op(base: str, overload: str) -> Any:
    """``aten.<base>.<overload>``, or None where torch has no such op."""
    packet = getattr(aten, base, None) if base.isidentifier() else None
    return getattr(packet, overload or "default", None) if packet is not None else None


@functools.cache
def _pair(op: Any) -> Any:
    """The other half of ``op``'s view/copy pair (``aten::X.o`` returning an alias of its
    input, ``aten::X_copy.o``), or None. Looked up per op, when first asked: building the
    whole table from every registered op name cost every process a first-use tax."""
    schema = getattr(op, "_schema", None)
    if schema is None or not schema.name.startswith("aten::"):
        return None
    base, overload = schema.name[len("aten::") :], schema.overload_name
    view_base = base[: -len("_copy")] if base.endswith("_copy") else base
    view, copy = _op(view_base, overload), _op(view_base + "_copy", overload)
    if view is None or copy is None:
        return None
    returns = view._schema.returns
    aliases = any(r.alias_info is not None and not r.alias_info.is_write for r in returns)
    if not aliases and not any(a.alias_info is not None for a in view._schema.arguments):
        return None  # not a view (e.g. index vs index_copy)
    return copy if op is view else view if op is copy else None


def copy_variant(op: Any) -> Any:
    """The ``*_copy`` variant of the ATen view op ``op`` (of an Edge op: its ATen op's), or
    None when it has none."""
    op = aten_op(op)
    found = _pair(op) if _hashable(op) else None
    return found if found is not None and found._schema.name.endswith("_copy") else None


def view_variant(op: Any) -> Any:
    """The ATen view op whose ``*_copy`` variant ``op`` is (Edge ops too), or None."""
    op = aten_op(op)
    found = _pair(op) if _hashable(op) else None
    return found if found is not None and not found._schema.name.endswith("_copy") else None


def _hashable(op: Any) -> bool:
    return isinstance(op, torch._ops.OpOverload)


def view_base_name(node: fx.Node) -> str | None:
    """The name of the view (or value-preserving copy) ``node`` makes, whatever its
    spelling: ``"view"`` for ``aten.view``, ``aten.view_copy``, Edge ``view_copy`` and
    ``x.view(...)``; ``"clone"`` for ``aten.clone`` and ExecuTorch's ``_clone_dim_order``;
    None for anything else (including ``view`` to another dtype)."""
    if node.op == "call_method":
        name = str(node.target)
        return name if name in _ROW_KEEPERS else None
    if node.op != "call_function":
        return None
    target = node.target
    op = aten_op(target)
    if isinstance(op, torch._ops.OpOverload):
        if op._schema.name.endswith("_copy"):
            op = view_variant(op) or op
        name = op._schema.name
        if not name.startswith("aten::") or op._overloadname == "dtype":
            return None
        name = name[6:]
    elif getattr(target, "__module__", None) in ("torch", "torch._C._VariableFunctions"):
        name = getattr(target, "__name__", "")
    else:
        return None
    return name if name in _ROW_KEEPERS else None


def _val(node: Any) -> Any:
    if not isinstance(node, fx.Node):
        return None
    val = node.meta.get("val")
    return node.meta.get("example_value") if val is None else val


def _arg(node: fx.Node, index: int, name: str, default: Any) -> Any:
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def _norm_dim(dim: Any, rank: int) -> int | None:
    if not isinstance(dim, int) or isinstance(dim, bool) or rank == 0:
        return None
    return dim % rank if -rank <= dim < rank else None


def keeps_rows(node: fx.Node) -> bool:
    """Whether ``node`` is a shape-only op (a view, reshape, squeeze/unsqueeze, expand,
    permute/transpose or slice/select of the other dimensions, alias, clone — in any
    spelling: ATen, ``*_copy``, Edge, Python method) whose result's rows along the last
    dimension are rows of its first argument, unchanged. Reads the nodes' example values;
    False where they are missing."""
    name = view_base_name(node)
    if name is None or not node.args or not isinstance(node.args[0], fx.Node):
        return False
    out, src = _val(node), _val(node.args[0])
    if not isinstance(out, torch.Tensor) or not isinstance(src, torch.Tensor):
        return False
    if out.dim() == 0 or src.dim() == 0 or out.dtype != src.dtype:
        return False
    if out.shape[-1] != src.shape[-1]:
        return False
    if name in _RESHAPES or name in _IDENTITIES or name in _EXPANDS:
        return True
    last = src.dim() - 1
    if name in _PERMUTES:
        dims = node.args[1:] if node.op == "call_method" else _arg(node, 1, "dims", None)
        if node.op == "call_method" and len(dims) == 1 and isinstance(dims[0], (list, tuple)):
            dims = dims[0]
        return (
            isinstance(dims, (list, tuple))
            and len(dims) == src.dim()
            and (_norm_dim(dims[-1], src.dim()) == last)
        )
    if name in _TRANSPOSES:
        d0, d1 = _arg(node, 1, "dim0", None), _arg(node, 2, "dim1", None)
        n0, n1 = _norm_dim(d0, src.dim()), _norm_dim(d1, src.dim())
        return n0 is not None and n1 is not None and last not in (n0, n1)
    dim = _norm_dim(_arg(node, 1, "dim", 0), src.dim())  # slice, narrow, select
    return dim is not None and dim != last


# ----- view or copy ----------------------------------------------------------------------------
def always_view(op: Any) -> bool:
    """Whether ``op`` always returns a view of its input, whatever the layout: the ops
    functionalization pairs with a ``*_copy`` variant (``view``, ``expand``, ``permute``,
    ``slice``, ``split``, ``alias``...). ``reshape``, ``contiguous`` and ``to`` are not: they
    copy when the layout asks for it."""
    return copy_variant(op) is not None


def shares_storage(a: Any, b: Any) -> bool:
    """Whether two tensors (real, fake or meta) live in the same storage. Fake tensors keep
    aliasing: a traced view's ``meta['val']`` shares its base's storage."""
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        return False
    try:
        return a.untyped_storage()._cdata == b.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError):  # sparse, nested, functional wrappers
        return False


class _Unknown(Exception):
    pass


def _key(value: Any) -> Any:
    """A hashable stand-in for an example argument: a tensor by its (static) layout."""
    if isinstance(value, torch.Tensor):
        sizes, strides, offset = tuple(value.shape), value.stride(), value.storage_offset()
        static = all(type(s) is int for s in (*sizes, *strides, offset))
        if value.layout != torch.strided or not static:
            raise _Unknown
        device = getattr(value, "fake_device", None) or value.device
        return ("tensor", sizes, strides, offset, value.dtype, device)
    if isinstance(value, (list, tuple)):  # fx's immutable_list too
        return ("list" if isinstance(value, list) else "tuple", *(_key(v) for v in value))
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool, fx.Node)):
        raise _Unknown
    hash(value)
    return ("const", value)


def _rebuild(key: tuple, devices: set) -> Any:
    """The argument ``key`` stands for, tensors as empty meta tensors of the same layout."""
    kind = key[0]
    if kind == "tensor":
        _, sizes, strides, offset, dtype, device = key
        devices.add(device)
        extent = 1 + sum((n - 1) * st for n, st in zip(sizes, strides)) if all(sizes) else 0
        base = torch.empty(offset + extent, dtype=dtype, device="meta")
        return base.as_strided(sizes, strides, offset)
    if kind in ("list", "tuple"):
        items = [_rebuild(k, devices) for k in key[1:]]
        return items if kind == "list" else tuple(items)
    return key[1]


def returns_view(op: Any, args: tuple = (), kwargs: dict | None = None) -> bool | None:
    """Whether ``op`` called on tensors laid out like the example values in ``args`` and
    ``kwargs`` returns a view of (or the very) first tensor argument: True (a view, no
    kernel), False (a copy into fresh memory), None where it cannot be told (symbolic sizes,
    an argument without a value, an op meta tensors cannot run). torch's own kernels decide,
    on meta tensors; a move to another device always copies."""
    try:
        key = (_key(tuple(args)), _key(tuple(sorted((kwargs or {}).items()))))
    except (_Unknown, TypeError):
        return None
    return _returns_view(aten_op(op), *key)


@functools.lru_cache(maxsize=4096)
def _returns_view(op: Any, args_key: tuple, kwargs_key: tuple) -> bool | None:
    devices: set = set()
    args, kwargs = _rebuild(args_key, devices), dict(_rebuild(kwargs_key, devices))
    values = (*args, *kwargs.values())
    first = next((a for a in values if isinstance(a, torch.Tensor)), None)
    if first is None or len(devices) != 1:
        return None
    (home,) = devices
    if any(isinstance(v, torch.device) and v != home for v in values):
        return False  # a move to another device copies
    meta = torch.device("meta")
    args = tuple(meta if isinstance(a, torch.device) else a for a in args)
    kwargs = {k: meta if isinstance(v, torch.device) else v for k, v in kwargs.items()}
    try:
        out = op(*args, **kwargs)
    except Exception:  # broad: the op refuses this layout, or has no meta kernel: cannot tell
        return None
    outs = [
        o for o in (out if isinstance(out, (list, tuple)) else [out]) if isinstance(o, torch.Tensor)
    ]
    if not outs:
        return None
    return all(shares_storage(o, first) for o in outs)
