"""Custom ops' fake kernels, run once per fake mode and input metadata while tracing.

Tracing a search function with fake inputs (vLLM registers its patterns inside a fake mode)
runs every custom op's fake kernel — vLLM IR's is its whole native implementation, about ten
fake ATen ops — and torch's fake-tensor cache skips custom ops. vLLM's
``RMSNormQuantFusionPass`` traces 72 search functions calling the same two IR ops on the
same example sizes: 74 fake kernel runs, a fifth of its registration, for two results.

:func:`memoized_fake_kernels` remembers, per fake mode (vLLM makes one per pass
construction), the result of each custom op's fake kernel by everything it may read: the op,
its inputs' metadata (sizes, strides, dtype, device, layout, storage offset, autograd and
conj/neg bits), its other arguments, the default dtype and the grad mode; a repeat gets new
fake tensors of the same metadata, as torch's cache answers ATen ops. Only what a fake
kernel is bound to compute from its inputs' metadata is remembered (torch's contract for
fake kernels): ops with a functional schema (nothing written, nothing aliased), static
sizes in and out, plain tensor results on storages of their own, each exactly as large as its
sizes and strides need. ``auto_functionalized`` (vLLM's quant patterns call it 64 times in
``RMSNormQuantFusionPass``) is remembered the same way, keyed by its mutating op and
arguments: its fake rule clones the inputs the op writes and runs the op's fake kernel on the
clones, so its results are the op's and fresh tensors of the clones' metadata. Everything
else, and every ATen op, goes to the fake mode as before. The trace records the same nodes
either way (the proxy records the op, not what its fake kernel ran).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from ...fxutil.ops import schema_of
from ...fxutil.values import build_result

__all__ = ["memoized_fake_kernels"]

#: per fake mode: (op, inputs' metadata...) -> the results' metadata
_MEMOS: weakref.WeakKeyDictionary[Any, dict[tuple, tuple]] = weakref.WeakKeyDictionary()
_BUILTIN = frozenset({"aten", "prims", "prim"})
_PLAIN = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout)
_SKIP_TAGS = ("dynamic_output_shape", "data_dependent_output", "inplace_view")


def _fake_mode(args: Sequence[Any]) -> Any:
    from torch._guards import detect_fake_mode

    try:
        return detect_fake_mode(list(args))
    except Exception:  # broad: inputs of several fake modes: nothing is remembered
        return None


@contextlib.contextmanager
def memoized_fake_kernels(args: Sequence[Any]) -> Iterator[None]:
    """While tracing ``fn(*args)``: custom ops' fake kernels answered from the memo of
    ``args``' fake mode (nothing changes when the inputs are real tensors)."""
    mode = _fake_mode(args)
    if mode is None or "dispatch" in vars(mode):  # real inputs, or already remembering
        yield
        return
    memo = _MEMOS.get(mode)
    if memo is None:
        memo = _MEMOS[mode] = {}
    base = mode.dispatch

    def dispatch(func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        key = _key(func, args, kwargs) if _eligible(func, args) else None
        if key is None:
            return base(func, types, args, kwargs)
        hit = memo.get(key)
        if hit is not None:
            return build_result(hit, mode)
        out = base(func, types, args, kwargs)
        spec = _spec(out, args, kwargs)
        if spec is not None:
            memo[key] = spec
        return out

    mode.dispatch = dispatch  # this mode only, for this trace
    try:
        yield
    finally:
        del mode.dispatch


def _eligible(func: Any, args: Any = ()) -> bool:
    if func is _auto_functionalized():
        # the functional form of a mutating op: its fake rule clones the written inputs and
        # runs the op's fake kernel on the clones, so its results are the op's (computed from
        # metadata) and fresh clones; remembered when the op's own kernel could be
        op = args[0] if len(args) == 1 else None
        return isinstance(op, torch._ops.OpOverload) and not any(
            getattr(torch.Tag, t, None) in op.tags for t in _SKIP_TAGS
        )
    if not isinstance(func, torch._ops.OpOverload) or func.namespace in _BUILTIN:
        return False
    hit = _ELIGIBLE.get(func)
    if hit is None:
        schema = schema_of(func)
        hit = (
            schema is not None
            and not any(a.alias_info is not None for a in (*schema.arguments, *schema.returns))
            and not any(getattr(torch.Tag, t, None) in func.tags for t in _SKIP_TAGS)
        )
        _ELIGIBLE[func] = hit
    return hit


_ELIGIBLE: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


def _auto_functionalized() -> Any:
    return torch.ops.higher_order.auto_functionalized


def _meta(t: torch.Tensor) -> tuple | None:
    size, stride = tuple(t.shape), t.stride()
    if not all(type(v) is int for v in (*size, *stride)) or type(t.storage_offset()) is not int:
        return None
    return (
        size,
        stride,
        t.storage_offset(),
        t.dtype,
        t.device,
        t.layout,
        t.requires_grad,
        t.is_conj(),
        t.is_neg(),
    )


def _arg_key(a: Any) -> Any:
    if isinstance(a, torch.Tensor):
        m = _meta(a)
        if m is None:
            raise _NotKeyed
        return ("t", m)
    if isinstance(a, (list, tuple)):
        return (type(a).__name__, tuple(_arg_key(x) for x in a))
    if isinstance(a, torch._ops.OpOverload):  # auto_functionalized's op
        return ("op", a)
    if type(a) in _PLAIN or isinstance(a, torch.memory_format):
        return (type(a).__name__, a)
    raise _NotKeyed


class _NotKeyed(Exception):
    pass


def _key(func: Any, args: Any, kwargs: dict[str, Any]) -> tuple | None:
    try:
        return (
            func,
            _arg_key(tuple(args)),
            tuple((k, _arg_key(v)) for k, v in kwargs.items()),
            torch.get_default_dtype(),
            torch.is_grad_enabled(),
        )
    except _NotKeyed:
        return None


def _spec(out: Any, args: Any, kwargs: dict[str, Any]) -> tuple | None:
    """The results' metadata as :func:`~fxpass.fxutil.values.build_result` makes them anew,
    if it can: plain strided tensors at offset 0 on storages of their own (none an input's),
    static sizes, no autograd."""
    from torch._prims_common import compute_required_storage_length
    from torch.multiprocessing.reductions import StorageWeakRef

    many = type(out) in (tuple, list)
    outs = list(out) if many else [out]
    inputs = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
    seen = {StorageWeakRef(a.untyped_storage()) for a in inputs}
    specs: list[tuple] = []
    for t in outs:
        if t is None and many:  # auto_functionalized of an op returning nothing
            specs.append(("V", None))
            continue
        if not isinstance(t, torch.Tensor) or type(t).__name__ != "FakeTensor":
            return None
        m = _meta(t)
        if m is None or m[2] != 0 or m[5] != torch.strided or m[6] or m[7] or m[8]:
            return None
        # a storage exactly as large as the sizes and strides need (build_result makes that)
        needed = compute_required_storage_length(m[0], m[1], 0) if t.numel() else 0
        if t.untyped_storage().nbytes() != needed * t.element_size():
            return None
        storage = StorageWeakRef(t.untyped_storage())
        if storage in seen:
            return None
        seen.add(storage)
        specs.append(("T", m[0], m[1], m[3], m[4]))
    return (type(out), tuple(specs)) if many else specs[0]  # fxutil.values.build_result's
