"""When two fake values describe the same thing, so an op's fake result can be reused.

An interpreter pass that replaces one node (``add`` -> ``mul`` + ``sub``) hands every node
downstream a new input value. Running each of them on fake tensors again costs hundreds of
microseconds a node; but an op's fake result depends only on its inputs' metadata, so
where the new input has the metadata of the old one, the old ``meta['val']`` stands.

:func:`same_value` decides that without evaluating symbolic sizes (comparing SymInts with
``==`` would add guards to the shape environment): symbols compare by expression.
:func:`returns_alias` names the ops whose results share storage with an input — their
fake result records *which* tensor it aliases, so they are re-run whenever an input is new.
:class:`FakeResults` remembers what an op computed on inputs with given (static) metadata,
so the next node running that op on such inputs gets a fresh fake tensor without dispatch.

>>> import torch
>>> same_value(torch.empty(2, 3), torch.empty(2, 3)), same_value(torch.empty(2, 3), 4)
(True, False)
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import fx
from torch._guards import detect_fake_mode
from torch._subclasses.fake_tensor import FakeTensorMode

__all__ = ["FakeResults", "fake_value", "node_val", "returns_alias", "same_value"]

_SYM = (torch.SymInt, torch.SymFloat, torch.SymBool)
_SCALARS = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.memory_format)


def _same_scalar(a: Any, b: Any) -> bool:
    if isinstance(a, _SYM) or isinstance(b, _SYM):
        if not (isinstance(a, _SYM) and isinstance(b, _SYM)) or type(a) is not type(b):
            return False
        return a.node.expr == b.node.expr
    return type(a) is type(b) and a == b


def _same_sizes(a: Any, b: Any) -> bool:
    return len(a) == len(b) and all(_same_scalar(x, y) for x, y in zip(a, b))


def _same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    if type(a) is not type(b) or a.dtype != b.dtype or a.layout != b.layout:
        return False
    if not (a._has_symbolic_sizes_strides or b._has_symbolic_sizes_strides):
        return _same_static(a, b)  # the common case, compared in C
    ca, cb = getattr(a, "constant", None), getattr(b, "constant", None)
    if (ca is not None or cb is not None) and (  # a constant-folded fake tensor has data too
        ca is None or cb is None or not _same_tensor(ca, cb) or not torch.equal(ca, cb)
    ):
        return False
    if a.requires_grad != b.requires_grad or a.is_quantized or b.is_quantized:
        return False
    device_a = getattr(a, "fake_device", None) or a.device  # FakeTensor.device is slow
    device_b = getattr(b, "fake_device", None) or b.device
    if device_a != device_b or not _same_sizes(a.shape, b.shape):
        return False
    if a.layout != torch.strided:
        return True
    return _same_sizes(a.stride(), b.stride()) and _same_scalar(
        a.storage_offset(), b.storage_offset()
    )


def _same_static(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.requires_grad != b.requires_grad:
        return False
    if a.is_quantized or b.is_quantized:
        return False
    if (getattr(a, "fake_device", None) or a.device) != (
        getattr(b, "fake_device", None) or b.device
    ):
        return False
    if a.layout == torch.strided and (
        a.stride() != b.stride() or a.storage_offset() != b.storage_offset()
    ):
        return False
    ca, cb = getattr(a, "constant", None), getattr(b, "constant", None)
    if ca is None and cb is None:
        return True
    return ca is not None and cb is not None and _same_tensor(ca, cb) and torch.equal(ca, cb)


def same_value(new: Any, old: Any) -> bool:
    """Whether ``new`` has exactly ``old``'s metadata: for tensors the type, dtype, device,
    layout, sizes, strides and storage offset (and the data of a constant-folded fake
    tensor); for symbolic scalars the same expression;
    for other scalars equality; element by element for tuples and lists."""
    if new is old:
        return True
    if isinstance(new, torch.Tensor):
        return isinstance(old, torch.Tensor) and _same_tensor(new, old)
    if isinstance(new, (tuple, list)):
        return (
            type(new) is type(old)
            and len(new) == len(old)
            and all(same_value(a, b) for a, b in zip(new, old))
        )
    if isinstance(new, (*_SYM, *_SCALARS)):
        return _same_scalar(new, old)
    return False


@functools.cache
def _aliasing(op: Any) -> bool:
    schema = getattr(op, "_schema", None)
    if schema is None:
        return True  # unknown: assume the worst
    return any(r.alias_info is not None for r in schema.returns)


def returns_alias(op: Any) -> bool:
    """Whether ``op`` (an ATen-style overload) returns a view of, or writes into, one of its
    inputs; True for callables without a schema."""
    try:
        return _aliasing(op)
    except TypeError:  # unhashable target
        return True


class _Uncacheable(Exception):
    pass


def _tensor_key(t: torch.Tensor) -> tuple:
    from torch._subclasses.fake_tensor import FakeTensor

    fake = type(t) is FakeTensor
    if (fake and t.constant is not None) or t.layout != torch.strided or t.is_quantized:
        raise _Uncacheable  # a constant's data may matter
    if not fake and type(t) not in (torch.Tensor, torch.nn.Parameter):
        raise _Uncacheable
    sizes, strides, offset = tuple(t.shape), t.stride(), t.storage_offset()
    if not all(type(s) is int for s in (*sizes, *strides, offset)):
        raise _Uncacheable  # symbolic sizes: a guard-free key is not worth it
    device = t.fake_device if fake else t.device
    return (fake, sizes, strides, offset, t.dtype, device, t.requires_grad)


def _key(value: Any, fakes: list[bool]) -> Any:
    if isinstance(value, torch.Tensor):
        key = _tensor_key(value)
        fakes.append(key[0])
        return key
    if isinstance(value, (tuple, list)):
        return (type(value), tuple(_key(v, fakes) for v in value))
    if isinstance(value, dict):
        return (dict, tuple((k, _key(v, fakes)) for k, v in value.items()))
    if isinstance(value, _SYM) or not isinstance(value, _SCALARS):
        raise _Uncacheable
    return (type(value), value)


def _spec(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        fake, sizes, strides, offset, dtype, device, grad = _tensor_key(value)
        if offset or not fake or value.constant is not None:
            raise _Uncacheable
        return ("T", sizes, strides, dtype, device, grad)
    if isinstance(value, (tuple, list)):
        return (type(value), tuple(_spec(v) for v in value))
    if isinstance(value, _SYM) or not isinstance(value, _SCALARS):
        raise _Uncacheable
    return ("V", value)


def _build(spec: Any, mode: Any) -> Any:
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():  # plain meta tensors, not a dispatch through the mode
        return _make(spec, mode)


def _make(spec: Any, mode: Any) -> Any:
    from torch._subclasses.fake_tensor import FakeTensor

    kind = spec[0]
    if kind == "T":
        _, sizes, strides, dtype, device, grad = spec
        meta = torch.empty_strided(sizes, strides, dtype=dtype, device="meta")
        out = FakeTensor(mode, meta, device)
        return out.requires_grad_() if grad else out
    if kind == "V":
        return spec[1]
    return kind(_make(s, mode) for s in spec[1])


class FakeResults:
    """What ops computed on fake inputs, by the inputs' metadata (static shapes only).

    >>> cache = FakeResults()                                   # doctest: +SKIP
    >>> out = cache.get(op, args, kwargs, mode)                 # None: not known
    >>> if out is None: out = cache.put(op, args, kwargs, op(*args, **kwargs))

    A hit is a *fresh* fake tensor (its own storage) with the remembered sizes, strides,
    dtype, device and ``requires_grad``. Never cached: ops that alias an input; calls with a
    constant-folded input, with symbolic sizes, or without a fake (non-constant) tensor
    input (fake tensor mode may fold those into constants).
    """

    def __init__(self, limit: int = 4096) -> None:
        self._specs: dict[Any, tuple[Any, Any]] = {}
        self.limit = limit
        self.hits = 0

    def _key(self, op: Any, args: Any, kwargs: Any) -> Any:
        if returns_alias(op):
            raise _Uncacheable
        fakes: list[bool] = []
        key = (id(op), torch.is_grad_enabled(), _key(tuple(args), fakes), _key(kwargs, fakes))
        if not any(fakes):
            raise _Uncacheable
        return key

    def get(self, op: Any, args: Any, kwargs: Any, mode: Any) -> Any:
        """A fresh result for ``op(*args, **kwargs)`` if one was remembered, else None."""
        try:
            hit = self._specs.get(self._key(op, args, kwargs))
        except (_Uncacheable, TypeError):
            return None
        if hit is None or hit[0] is not op or mode is None:
            return None
        self.hits += 1
        return _build(hit[1], mode)

    def put(self, op: Any, args: Any, kwargs: Any, result: Any) -> Any:
        """Remember ``result`` (what ``op`` computed on ``args``) where it can; returns it."""
        try:
            key, spec = self._key(op, args, kwargs), _spec(result)
        except (_Uncacheable, TypeError):
            return result
        if len(self._specs) >= self.limit:
            self._specs.clear()
        self._specs[key] = (op, spec)  # the op keeps its id valid
        return result


def node_val(node: Any) -> Any:
    """The example value of a node: ``meta["val"]`` (export, AOT) or ``["example_value"]``."""
    if not isinstance(node, fx.Node):
        return None
    val = node.meta.get("val")
    return node.meta.get("example_value") if val is None else val


def fake_value(
    target: Any,
    args: Any,
    kwargs: Any,
    *,
    method: bool = False,
    like: Any = None,
    mode: Any = None,
    strict: bool = False,
) -> Any:
    """What ``target(*args, **kwargs)`` would return, computed on the nodes' example values
    in their fake mode (or ``like``'s, for calls without tensor arguments; or in ``mode``
    when one is given); None when an argument has no example value or the call fails —
    with ``strict``, those failures raise instead."""
    missing = []

    def val(n: fx.Node) -> Any:
        v = node_val(n)
        if v is None:
            missing.append(n)
        return v

    fargs, fkwargs = fx.node.map_arg((args, kwargs), val)
    if missing:
        if strict:
            names = ", ".join(f"'{n.name}'" for n in missing)
            raise ValueError(f"no example value (meta['val']) for the input(s) {names}")
        return None
    if mode is None:
        try:
            mode = detect_fake_mode((fargs, fkwargs, like))
        except AssertionError:  # example values from different fake modes
            if strict:
                raise
            return None
    if mode is None:
        mode = FakeTensorMode(allow_non_fake_inputs=True)
    try:
        with mode:
            if method:
                return getattr(fargs[0], target)(*fargs[1:], **fkwargs)
            return target(*fargs, **fkwargs)
    except Exception:  # an op the fake mode cannot run: the caller leaves the node alone
        if strict:
            raise
        return None
