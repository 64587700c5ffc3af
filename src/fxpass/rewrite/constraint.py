"""What a pattern checks on a value: literal equality and constraints on ``meta['val']``.

>>> import torch
>>> from torch.fx.experimental.proxy_tensor import make_fx
>>> node = next(iter(make_fx(torch.relu)(torch.randn(2, 3)).graph.nodes))
>>> Constraint(dtype=torch.float32, rank=2).failure(node)   # None: it holds
>>> Constraint(dtype=torch.float16).failure(node)           # or why not
'dtype of %arg0_1 is torch.float32, expected torch.float16'
"""

from __future__ import annotations

from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.fx import Node

from ..fxutil.dialect import aten_op
from ..fxutil.ops import schema_of
from ._state import MISSING
from .spelling import CAST_OPS, OpOverload

__all__ = ["Constraint", "lit_eq", "show", "value_of"]


def value_of(v: Any) -> Any:
    """The value a pattern constraint inspects: a node's ``meta['val']`` (or Dynamo's
    ``example_value``, or ``tensor_meta``)."""
    if isinstance(v, Node):
        meta = v.meta
        val = meta.get("val", MISSING)
        if val is MISSING:  # Dynamo graphs keep fake values as example_value
            val = meta.get("example_value", MISSING)
            if val is MISSING:
                val = meta.get("tensor_meta", MISSING)
        return val
    return v


def show(v: Any) -> str:
    """A value as messages print it: ``%name`` for a node."""
    if isinstance(v, Node):
        return f"%{v.name}"
    return repr(v)


def lit_eq(p: Any, v: Any) -> bool:
    """Literal equality: bools only equal bools; lists equal tuples element-wise."""
    if p is v:
        return True
    tp, tv = type(p), type(v)
    if tp is bool or tv is bool:
        return tp is tv and p == v
    if isinstance(p, (list, tuple)):
        return (
            isinstance(v, (list, tuple))
            and len(p) == len(v)
            and all(lit_eq(a, b) for a, b in zip(p, v))
        )
    if isinstance(v, (Node, list, tuple)):
        return False
    try:
        return bool(p == v)
    except Exception:  # broad: values that cannot be compared (tensors) are not equal
        return False


def lit_eq_exact(p: Any, v: Any) -> bool:
    """torch's rule: the same Python type and equal (lists recurse element-wise)."""
    if isinstance(p, (list, tuple)) and isinstance(v, (list, tuple)):
        return len(p) == len(v) and all(lit_eq_exact(a, b) for a, b in zip(p, v))
    try:
        return type(p) is type(v) and bool(p == v)
    except Exception:  # broad: values that cannot be compared (tensors) are not equal
        return False


class Constraint:
    """dtype / rank / shape / predicate constraints on a value's ``meta['val']``."""

    __slots__ = ("dtype", "rank", "shape", "where")

    def __init__(self, dtype=None, rank=None, shape=None, where=None) -> None:
        if isinstance(dtype, torch.dtype):
            dtype = frozenset([dtype])
        elif dtype is not None:
            dtype = frozenset(dtype)
        if isinstance(rank, int):
            rank = frozenset([rank])
        elif rank is not None:
            rank = frozenset(rank)
        self.dtype = dtype
        self.rank = rank
        self.shape = tuple(shape) if shape is not None else None
        self.where = where

    def __bool__(self) -> bool:
        return any(x is not None for x in (self.dtype, self.rank, self.shape, self.where))

    def checks_meta(self) -> bool:
        """Whether it constrains ``meta['val']`` (dtype, rank or shape), besides ``where``."""
        return self.dtype is not None or self.rank is not None or self.shape is not None

    def failure(self, v: Any, what: Any = None) -> str | None:
        """None if ``v`` satisfies the constraints, else why not."""
        if self.dtype is not None or self.rank is not None or self.shape is not None:
            why = self.meta_failure(v)
            if why is not None:
                return why
        if self.where is not None:
            try:
                ok = self.where(what if what is not None else v)
            except Exception as e:  # broad: reported — a predicate that raises says no, and why
                return f"predicate {fn_name(self.where)} raised {type(e).__name__}: {e}"
            if not ok:
                return f"predicate {fn_name(self.where)} is false for {show(v)}"
        return None

    def meta_failure(self, v: Any) -> str | None:
        """None if ``v``'s value has the dtype, rank and shape asked for, else why not."""
        val = value_of(v)
        if val is MISSING:
            return f"{show(v)} has no meta['val'] to check dtype/rank/shape against"
        if self.dtype is not None:
            dt = getattr(val, "dtype", None)
            if dt not in self.dtype:
                want = " or ".join(sorted(str(d) for d in self.dtype))
                return f"dtype of {show(v)} is {dt}, expected {want}"
        shape = getattr(val, "shape", None)
        if self.rank is not None and (shape is None or len(shape) not in self.rank):
            n = None if shape is None else len(shape)
            return f"rank of {show(v)} is {n}, expected {sorted(self.rank)}"
        if self.shape is not None:
            if shape is None or len(shape) != len(self.shape):
                return f"shape of {show(v)} is {shape}, expected {self.shape}"
            for have, want in zip(shape, self.shape):
                if want is not None and have != want:
                    return f"shape of {show(v)} is {tuple(shape)}, expected {self.shape}"
        return None


def fn_name(fn: Any) -> str:
    name = getattr(fn, "__name__", repr(fn))
    code = getattr(fn, "__code__", None)
    if name == "<lambda>" and code is not None:
        return f"<lambda at line {code.co_firstlineno}>"
    return name


def is_pure_cast(node: Node) -> bool:
    """A cast changes only the dtype: same shape and device as its input (when known)."""
    out = value_of(node)
    src = value_of(node.args[0]) if node.args else MISSING
    if out is MISSING or src is MISSING or not isinstance(out, torch.Tensor):
        return True
    if not isinstance(src, torch.Tensor):
        return False
    if out.__class__ is _Fake and src.__class__ is _Fake:  # the common case, without properties
        return out.shape == src.shape and out._fake_device == src._fake_device
    return out.shape == src.shape and _device(out) == _device(src)


_Fake = FakeTensor


def _device(t: torch.Tensor) -> Any:
    return getattr(t, "fake_device", None) or t.device  # FakeTensor.device is slow


def is_noop_cast(node: Node) -> bool:
    """A cast (any spelling) whose result has its input's dtype, shape and device."""
    if node.op == "call_function":
        t = node.target
        if t not in CAST_OPS and aten_op(t) not in CAST_OPS:
            return False
    elif node.target not in CAST_OPS:
        return False
    out, src = value_of(node), value_of(node.args[0])
    if not isinstance(out, torch.Tensor) or not isinstance(src, torch.Tensor):
        return False
    return out.dtype == src.dtype and out.shape == src.shape and _device(out) == _device(src)


def constant_number(node: Node) -> Any:
    """The number a lifted one-element constant (placeholder or attribute) holds, else None.

    Export keeps the value of constants it lifts on their fake tensors (``.constant``);
    a value nobody writes in place is the same number every run."""
    if node.op not in ("placeholder", "get_attr"):
        return None
    val = value_of(node)
    const = getattr(val, "constant", None)
    if not isinstance(const, torch.Tensor) or const.numel() != 1:
        return None
    for user in node.users:
        target = aten_op(user.target)
        if isinstance(target, OpOverload) and any(
            a.alias_info is not None and a.alias_info.is_write for a in schema_of(target).arguments
        ):
            return None  # written in place: not a constant
    return const.item()
