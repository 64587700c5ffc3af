"""What an op computed on fake inputs with symbolic sizes, remembered per fake mode.

A rewrite gives every new node ``meta['val']`` by running its op on its inputs' fake values
(:mod:`.metadata`). On a graph captured with a dynamic dimension (vLLM marks the token count
dynamic) those values have symbolic sizes, which the process-wide :class:`FakeResults
<fxpass.fxutil.values.FakeResults>` does not key; and the ops a layer-stacked model repeats
can be costly to run on fake values (one vLLM IR op's fake implementation is a Python
decomposition: ~20 ms a call). Their results depend only on the inputs' metadata, so a
replacement repeated at every layer with the same sizes computes the same value each time.

:class:`SymbolicResults` remembers them as torch's own fake-tensor cache does for symbolic
inputs (on the shape environment): keyed by the op, the state that can change what a fake
kernel returns (grad mode, inference mode, default dtype and device, the mode's epoch, a
proxy mode tracing) and every input's dtype, device, sizes, strides and storage offset —
symbolic ones by their expressions in the fake mode's shape environment, which are the same
symbols for every value of one graph. Every call of one key would make the same guards: the
first made them in that environment, so a hit adds none and loses none.

Never remembered (the caller computes the value, as before): calls without a symbolic input
(the static cache's), ops that write into or return a view of an input (``auto_functionalized``
does neither: it returns copies of what its op writes), calls with a
constant-folded, real, quantized, non-strided, conjugated or negated tensor, with a symbolic
float or bool; results that require grad, that have a storage offset, or whose sizes use a
symbol no input has (an unbacked size the op made up).

A hit is the value of the node being replaced where it has exactly the remembered metadata
(as :class:`FakeResults` does), else a fresh fake tensor with the remembered sizes and
strides (the same ``SymInt``\\ s).
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.fx.experimental.proxy_tensor import get_proxy_mode

from ..fxutil.ops import schema_of
from ..fxutil.values import build_result

__all__ = ["SYMBOLIC_RESULTS", "SymbolicResults"]

_QUANTIZED = frozenset({torch.qint8, torch.quint8, torch.qint32, torch.quint4x2, torch.quint2x4})
_SCALARS = frozenset({int, float, bool, str, type(None), torch.dtype, torch.device})
_SCALARS |= {torch.memory_format, torch.layout}


class _Uncacheable(Exception):
    pass


#: Higher-order ops that are functional by construction: they return fresh copies of what
#: the op they wrap writes (their first argument, an op overload, is keyed by identity).
_FUNCTIONAL_HOPS = (
    torch.ops.higher_order.auto_functionalized,
    torch.ops.higher_order.auto_functionalized_v2,
)


@functools.cache
def _aliasing(op: Any) -> bool:
    if any(op is hop for hop in _FUNCTIONAL_HOPS):
        return False
    schema = schema_of(op)
    if schema is None:
        return True
    return any(a.alias_info is not None for a in (*schema.arguments, *schema.returns))


def _writes_or_aliases(op: Any) -> bool:
    """Whether ``op`` writes into an argument or returns an alias of one (True for targets
    without a schema: functions, packets)."""
    try:
        return _aliasing(op)
    except TypeError:  # unhashable target
        return True


class _Keyer:
    """Builds one call's key: the fake mode of its tensors, the free symbols of their sizes,
    whether any size is symbolic."""

    __slots__ = ("mode", "seen", "symbolic", "symbols")

    def __init__(self) -> None:
        self.mode: Any = None
        self.seen: dict[int, int] = {}
        self.symbols: set[Any] = set()
        self.symbolic = False

    def size(self, s: Any) -> Any:
        if type(s) is int:
            return s
        if isinstance(s, torch.SymInt):
            expr = s.node.expr
            self.symbols |= expr.free_symbols
            self.symbolic = True
            return ("s", expr)
        raise _Uncacheable

    def tensor(self, t: torch.Tensor) -> tuple:
        if type(t) is not FakeTensor or t.constant is not None:
            raise _Uncacheable  # real tensors, constants: their data may matter
        if t.layout is not torch.strided or t.dtype in _QUANTIZED or t.is_conj() or t.is_neg():
            raise _Uncacheable
        if self.mode is None:
            self.mode = t.fake_mode
        elif t.fake_mode is not self.mode:
            raise _Uncacheable
        size = self.size
        return (
            "T",
            t.dtype,
            t.fake_device,
            tuple([size(s) for s in t.shape]),
            tuple([size(s) for s in t.stride()]),
            size(t.storage_offset()),
            t.requires_grad,
            self.seen.setdefault(id(t), len(self.seen)),  # one value passed twice stays one
        )

    def key(self, value: Any) -> Any:
        cls = type(value)
        if cls in _SCALARS:
            return (cls, value)
        if isinstance(value, torch.Tensor):
            return self.tensor(value)
        if isinstance(value, torch.SymInt):
            return ("sym", self.size(value))
        if isinstance(value, torch._ops.OpOverload):  # auto_functionalized's op
            return ("op", value)
        if cls in (tuple, list):
            return (cls, tuple([self.key(v) for v in value]))
        if cls is dict:
            return (dict, tuple([(k, self.key(v)) for k, v in value.items()]))
        raise _Uncacheable  # SymFloat, SymBool, opaque objects


def _symbolic_in(values: Any) -> bool:
    """Whether a tensor among ``values`` (nested lists and tuples too) has symbolic sizes,
    strides or storage offset, or a value is a ``SymInt``: what makes a call's key symbolic."""
    for v in values:
        if isinstance(v, torch.Tensor):
            if v._has_symbolic_sizes_strides:
                return True
        elif isinstance(v, torch.SymInt):
            return True
        elif type(v) in (tuple, list):
            if _symbolic_in(v):
                return True
        elif type(v) is dict and _symbolic_in(v.values()):
            return True
    return False


def _free_symbols(s: Any) -> set[Any]:
    return s.node.expr.free_symbols if isinstance(s, torch.SymInt) else set()


def _spec(value: Any, mode: Any, symbols: set[Any]) -> Any:
    """The metadata a result is rebuilt from (see the module docstring for what refuses)."""
    if isinstance(value, torch.Tensor):
        if type(value) is not FakeTensor or value.fake_mode is not mode:
            raise _Uncacheable
        if value.constant is not None or value.requires_grad or value.layout is not torch.strided:
            raise _Uncacheable
        if value.is_conj() or value.is_neg() or value.storage_offset() != 0:
            raise _Uncacheable
        shape, stride = tuple(value.shape), tuple(value.stride())
        for s in (*shape, *stride):
            if type(s) is not int and not (
                isinstance(s, torch.SymInt) and _free_symbols(s) <= symbols
            ):
                raise _Uncacheable
        return ("T", shape, stride, value.dtype, value.fake_device)
    if type(value) in (tuple, list):
        return (type(value), tuple(_spec(v, mode, symbols) for v in value))
    if type(value) in (int, float, bool, type(None)):  # None: in a tuple (a top-level None
        return ("V", value)  # is what a failed computation gives: never remembered)
    if isinstance(value, torch.SymInt) and _free_symbols(value) <= symbols:
        return ("V", value)
    raise _Uncacheable


def _same_sizes(a: tuple, b: tuple) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if type(x) is int or type(y) is int:
            if type(x) is not int or type(y) is not int or x != y:
                return False
        elif x.node.expr != y.node.expr:  # structural: no guard
            return False
    return True


def _fits(prefer: Any, spec: tuple, mode: Any) -> bool:
    """Whether ``prefer`` is a fake tensor of ``mode`` with exactly the metadata ``spec``."""
    if type(prefer) is not FakeTensor or prefer.fake_mode is not mode:
        return False
    _, shape, stride, dtype, device = spec
    if prefer.dtype != dtype or prefer.fake_device != device or prefer.requires_grad:
        return False
    if prefer.constant is not None or prefer.layout is not torch.strided:
        return False
    if prefer.is_conj() or prefer.is_neg() or not _same_sizes((prefer.storage_offset(),), (0,)):
        return False
    return _same_sizes(tuple(prefer.shape), shape) and _same_sizes(tuple(prefer.stride()), stride)


class SymbolicResults:
    """Results of ops on fake inputs with symbolic sizes, per fake mode (see the module
    docstring).

    >>> cache = SymbolicResults()                                          # doctest: +SKIP
    >>> out = cache.call(op, args, kwargs, lambda: compute(op, args, kwargs))  # doctest: +SKIP

    ``limit``: entries kept per fake mode (all dropped when it is reached).
    """

    def __init__(self, limit: int = 4096) -> None:
        self._modes: weakref.WeakKeyDictionary[Any, dict[Any, tuple[Any, Any]]] = (
            weakref.WeakKeyDictionary()
        )
        self.limit = limit
        self.hits = 0
        self.misses = 0

    @staticmethod
    def _key(op: Any, args: Any, kwargs: Any) -> tuple[Any, _Keyer]:
        keyer = _Keyer()
        key = (
            id(op),
            torch.is_grad_enabled(),
            torch.is_inference_mode_enabled(),
            torch.get_default_dtype(),
            torch.get_default_device(),
            get_proxy_mode() is not None,
            keyer.key(tuple(args)),
            keyer.key(dict(kwargs)) if kwargs else (),
        )
        if not keyer.symbolic or keyer.mode is None or keyer.mode.shape_env is None:
            raise _Uncacheable  # static sizes: FakeResults' (or no fake mode at all)
        return (keyer.mode.epoch, *key), keyer

    def call(
        self,
        op: Any,
        args: Any,
        kwargs: Any,
        compute: Callable[[], Any],
        *,
        prefer: Any = None,
    ) -> Any:
        """``op(*args, **kwargs)``'s fake result: remembered, or ``compute()`` (then
        remembered where it can be; a None result never is). ``prefer``: the values to
        return in place of fresh tensors where they have the remembered metadata."""
        if not (_symbolic_in(args) or (kwargs and _symbolic_in(kwargs.values()))):
            return compute()  # static sizes (a flag per tensor): no key to build
        try:
            if _writes_or_aliases(op):
                raise _Uncacheable
            key, keyer = self._key(op, args, kwargs)
        except (_Uncacheable, TypeError):  # TypeError: an unhashable target or value
            return compute()
        table = self._modes.get(keyer.mode)
        hit = table.get(key) if table is not None else None
        if hit is not None and hit[0] is op:
            self.hits += 1
            return build_result(hit[1], keyer.mode, prefer, _fits)
        out = compute()
        self.misses += 1
        if out is None:
            return out
        try:
            spec = _spec(out, keyer.mode, keyer.symbols)
        except _Uncacheable:
            return out
        if table is None:
            table = self._modes.setdefault(keyer.mode, {})
        if len(table) >= self.limit:
            table.clear()
        table[key] = (op, spec)  # the op keeps its id valid
        return out


#: The process's results (the rewriter's metadata uses it).
SYMBOLIC_RESULTS = SymbolicResults()
