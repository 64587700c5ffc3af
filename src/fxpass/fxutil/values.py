"""Fake values: computing them (one evaluator), comparing them, and reusing an op's result.

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
:class:`FakeEvaluator` is the one place fxpass runs ops on fake values — with an explicit
:class:`Strictness` for what happens when it cannot.

>>> import torch
>>> same_value(torch.empty(2, 3), torch.empty(2, 3)), same_value(torch.empty(2, 3), 4)
(True, False)
"""

from __future__ import annotations

import contextlib
import enum
import functools
import logging
from collections import deque
from collections.abc import Callable
from typing import Any

import torch
from torch import fx
from torch._guards import detect_fake_mode
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensor,
    FakeTensorMode,
    UnsupportedOperatorException,
    unset_fake_temporarily,
)
from torch.utils import _pytree as pytree

from .messages import error_summary

__all__ = [
    "FAKE_RESULTS",
    "FakeEvaluator",
    "FakeResults",
    "Strictness",
    "build_result",
    "fake_value",
    "node_val",
    "returns_alias",
    "same_value",
]

_LOG = logging.getLogger("fxpass.values")

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


def _same_tensor(a: torch.Tensor, b: torch.Tensor, grad: bool = True) -> bool:
    if type(a) is not type(b) or a.dtype != b.dtype or a.layout != b.layout:
        return False
    if not (a._has_symbolic_sizes_strides or b._has_symbolic_sizes_strides):
        return _same_static(a, b, grad)  # the common case, compared in C
    ca, cb = getattr(a, "constant", None), getattr(b, "constant", None)
    if (ca is not None or cb is not None) and (  # a constant-folded fake tensor has data too
        ca is None or cb is None or not _same_tensor(ca, cb) or not torch.equal(ca, cb)
    ):
        return False
    if (grad and a.requires_grad != b.requires_grad) or a.is_quantized or b.is_quantized:
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


def _same_static(a: torch.Tensor, b: torch.Tensor, grad: bool = True) -> bool:
    if a.shape != b.shape or (grad and a.requires_grad != b.requires_grad):
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


def same_value(new: Any, old: Any, *, grad: bool = True) -> bool:
    """Whether ``new`` has exactly ``old``'s metadata: for tensors the type, dtype, device,
    layout, sizes, strides and storage offset (and the data of a constant-folded fake
    tensor); for symbolic scalars the same expression;
    for other scalars equality; element by element for tuples and lists. ``grad=False``
    leaves ``requires_grad`` out (an autograd property, not the value's)."""
    if new is old:
        return True
    if isinstance(new, torch.Tensor):
        return isinstance(old, torch.Tensor) and _same_tensor(new, old, grad)
    if isinstance(new, (tuple, list)):
        return (
            type(new) is type(old)
            and len(new) == len(old)
            and all(same_value(a, b, grad=grad) for a, b in zip(new, old))
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


_PLAIN = (torch.Tensor, torch.nn.Parameter)
_QUANTIZED = frozenset({torch.qint8, torch.quint8, torch.qint32, torch.quint4x2, torch.quint2x4})


def _tensor_key(t: torch.Tensor) -> tuple:
    kind = type(t)
    if kind is FakeTensor:
        if t.constant is not None:
            raise _Uncacheable  # a constant's data may matter
        fake, device = True, t.fake_device
    elif kind in _PLAIN:
        fake, device = False, t.device
    else:
        raise _Uncacheable
    # a fake tensor's metadata getters each ask the subclass for a __torch_function__
    # override (~0.3 us a read); FakeTensor's is torch's disabled one, so reading with
    # subclass overrides off gives the same values, cheaper
    with _NO_OVERRIDE() if fake else contextlib.nullcontext():
        if t._has_symbolic_sizes_strides or t.layout is not torch.strided:
            raise _Uncacheable  # symbolic sizes: a guard-free key is not worth it
        dtype = t.dtype
        if dtype in _QUANTIZED:
            raise _Uncacheable
        shape, strides = tuple(t.shape), t.stride()
        return (fake, shape, strides, t.storage_offset(), dtype, device, t.requires_grad)


_DISABLED = FakeTensor.__torch_function__ is torch._C._disabled_torch_function_impl
_NO_OVERRIDE = torch._C.DisableTorchFunctionSubclass if _DISABLED else contextlib.nullcontext

_SCALAR_TYPES = frozenset(_SCALARS)


def _key(value: Any, fakes: list[bool]) -> Any:
    cls = type(value)
    if cls is FakeTensor or isinstance(value, torch.Tensor):
        key = _tensor_key(value)
        fakes.append(key[0])
        return key
    if cls in _SCALAR_TYPES:  # the common case first: 1, 1.0 and True stay apart by type
        return (cls, value)
    if isinstance(value, (tuple, list)):
        return (type(value), tuple([_key(v, fakes) for v in value]))
    if isinstance(value, dict):
        return (dict, tuple([(k, _key(v, fakes)) for k, v in value.items()]))
    if isinstance(value, _SYM) or not isinstance(value, _SCALARS):
        raise _Uncacheable
    return (type(value), value)


def _spec(value: Any, grads: list[bool]) -> Any:
    """The metadata a result is rebuilt from; whether each tensor requires grad goes to
    ``grads`` (a tensor built from metadata cannot stand for one that does)."""
    if isinstance(value, torch.Tensor):
        fake, sizes, strides, offset, dtype, device, grad = _tensor_key(value)
        if offset or not fake or value.constant is not None:
            raise _Uncacheable
        grads.append(grad)
        return ("T", sizes, strides, dtype, device)
    if isinstance(value, (tuple, list)):
        return (type(value), tuple(_spec(v, grads) for v in value))
    if isinstance(value, _SYM) or not isinstance(value, _SCALARS):
        raise _Uncacheable
    return ("V", value)


def _fits(prefer: Any, spec: Any, mode: Any) -> bool:
    """Whether ``prefer`` is a fake tensor of ``mode`` with exactly the metadata ``spec``
    remembers (and no autograd history)."""
    if type(prefer) is not FakeTensor or prefer.fake_mode is not mode:
        return False
    try:
        key = _tensor_key(prefer)
    except _Uncacheable:
        return False
    _, sizes, strides, offset, dtype, device, grad = key
    return not (offset or grad) and (sizes, strides, dtype, device) == spec[1:]


def build_result(
    spec: Any, mode: Any, prefer: Any = None, fits: Callable[[Any, Any, Any], bool] = _fits
) -> Any:
    """A result with the metadata ``spec`` (``("T", sizes, strides, dtype, device)``, ``("V",
    value)`` or ``(tuple_type, parts)``): ``prefer``'s tensors where ``fits(prefer, spec,
    mode)``, else fresh fake tensors of ``mode`` (over plain meta tensors, made outside the
    mode; sizes may be the mode's symbols, made without adding guards)."""
    kind = spec[0]
    if kind == "T":
        if prefer is not None and fits(prefer, spec, mode):
            return prefer
        _, sizes, strides, dtype, device = spec
        env = mode.shape_env
        with unset_fake_temporarily(), env.suppress_guards() if env else contextlib.nullcontext():
            meta = torch.empty_strided(sizes, strides, dtype=dtype, device="meta")
            return FakeTensor(mode, meta, device)
    if kind == "V":
        return spec[1]
    parts = spec[1]
    prefer = tuple(prefer) if isinstance(prefer, (tuple, list)) else ()
    prefer = prefer + (None,) * (len(parts) - len(prefer))
    return kind(build_result(s, mode, p, fits) for s, p in zip(parts, prefer))


def _layout(spec: Any) -> Any:
    """The remembered result as meta tensors: sizes, strides and dtype, nothing else."""
    kind = spec[0]
    if kind == "T":
        _, sizes, strides, dtype, _device = spec
        return torch.empty_strided(sizes, strides, dtype=dtype, device="meta")
    if kind == "V":
        return spec[1]
    return kind(_layout(s) for s in spec[1])


class FakeResults:
    """What ops computed on fake inputs, by the inputs' metadata (static shapes only).

    >>> cache = FakeResults()                                   # doctest: +SKIP
    >>> out = cache.get(op, args, kwargs, mode)                 # None: not known  # doctest: +SKIP
    >>> if out is None: out = cache.put(op, args, kwargs, op(*args, **kwargs))  # doctest: +SKIP

    A hit is a *fresh* fake tensor (its own storage) with the remembered sizes, strides,
    dtype and device (or a tensor the caller prefers that has them); or, for a caller that
    reads only the layout (``layout_only``), the same meta tensors on every hit, built once.
    Never cached: ops that alias an input; calls with a constant-folded input, with symbolic
    sizes, or without a fake (non-constant) tensor input (fake tensor mode may fold those
    into constants). A result that requires grad is remembered for its layout alone: a
    tensor built from metadata would be an autograd leaf, which in-place ops refuse where
    the computed result takes them.
    """

    def __init__(self, limit: int = 4096) -> None:
        self._specs: dict[Any, tuple[Any, Any, bool]] = {}  # key -> (op, spec, whole)
        self._layouts: dict[Any, Any] = {}
        self.limit = limit
        self.hits = 0

    def _key(self, op: Any, args: Any, kwargs: Any) -> Any:
        if returns_alias(op):
            raise _Uncacheable
        fakes: list[bool] = []
        key = (
            id(op),
            torch.is_grad_enabled(),
            tuple([_key(a, fakes) for a in args]),
            _key(kwargs, fakes) if kwargs else (),
        )
        if not any(fakes):
            raise _Uncacheable
        return key

    def get(
        self,
        op: Any,
        args: Any,
        kwargs: Any,
        mode: Any,
        *,
        layout_only: bool = False,
        prefer: Any = None,
    ) -> Any:
        """A fresh result for ``op(*args, **kwargs)`` if one was remembered, else None;
        with ``layout_only``, its sizes, strides and dtype as meta tensors (no mode needed).
        ``prefer``: fake tensors (a tensor, or a tuple like the result) to return in place
        of fresh ones wherever they have exactly the remembered metadata."""
        try:
            key = self._key(op, args, kwargs)
        except (_Uncacheable, TypeError):
            return None
        hit = self._specs.get(key)
        if hit is None or hit[0] is not op or not (layout_only or hit[2]):
            return None  # a result that requires grad is remembered for its layout alone
        if layout_only:
            layout = self._layouts.get(key)
            if layout is None:
                layout = self._layouts[key] = _layout(hit[1])
            self.hits += 1
            return layout
        if mode is None:
            return None
        self.hits += 1
        return build_result(hit[1], mode, prefer)

    def put(self, op: Any, args: Any, kwargs: Any, result: Any) -> Any:
        """Remember ``result`` (what ``op`` computed on ``args``) where it can; returns it."""
        try:
            grads: list[bool] = []
            key, spec = self._key(op, args, kwargs), _spec(result, grads)
        except (_Uncacheable, TypeError):
            return result
        if len(self._specs) >= self.limit:
            self._specs.clear()
            self._layouts.clear()
        self._specs[key] = (op, spec, not any(grads))  # the op keeps its id valid
        return result


#: Fake results by op and input metadata, shared in the process (the evaluator's default).
FAKE_RESULTS = FakeResults()


def node_val(node: Any) -> Any:
    """The example value of a node: ``meta["val"]`` (export, AOT) or ``["example_value"]``."""
    if not isinstance(node, fx.Node):
        return None
    val = node.meta.get("val")
    return node.meta.get("example_value") if val is None else val


# ----- running ops on fake values --------------------------------------------------------------
class Strictness(enum.Enum):
    """What :class:`FakeEvaluator` does when it cannot compute a value.

    ``RAISE``: every failure raises — an input without an example value is a ``ValueError``
    naming it, a kernel's own error propagates (with a note naming the op and node).
    ``DECLINE``: what the fake mode *cannot say* — an input without a value, no fake mode
    to run in, a data-dependent output, a dynamic output shape, an op without a fake
    kernel — gives None; any other failure (a kernel rejecting its inputs) raises.
    ``LENIENT``: every failure gives None; the reason is kept in ``failures`` and logged
    (``fxpass.values``, debug level).
    """

    RAISE = "raise"
    DECLINE = "decline"
    LENIENT = "lenient"


#: What a fake mode cannot say (not a failure of the op or its inputs).
CANNOT_SAY = (
    DataDependentOutputException,
    DynamicOutputShapeException,
    UnsupportedOperatorException,
)


class _CannotSay(Exception):
    pass


def _fake_mode_of(values: Any) -> Any:
    """The fake mode of the fake tensors among ``values`` — theirs, not the tracing
    context's: inside a Dynamo backend the context holds another mode than the graph's
    example values, and an op on them runs only in their own."""
    modes = {id(v.fake_mode): v.fake_mode for v in pytree.tree_leaves(values) if _is_fake(v)}
    if len(modes) > 1:
        raise AssertionError(f"the values come from {len(modes)} different fake modes")
    return next(iter(modes.values()), None)


def _is_fake(v: Any) -> bool:
    return isinstance(v, torch.Tensor) and getattr(v, "fake_mode", None) is not None


class FakeEvaluator:
    """Runs ops on fake values: what a node would produce, without real data.

    ``mode``: the fake tensor mode to run in; None finds it from the values of each call
    (and, with ``new_mode``, falls back to a fresh permissive mode, else cannot say).
    ``strictness``: see :class:`Strictness`. ``cache``: results by op and input metadata
    (:class:`FakeResults`, shared in the process by default; None: always dispatch).
    ``owner``: who is asking, for notes and logs.

    >>> ev = FakeEvaluator(strictness="decline")                # doctest: +SKIP
    >>> ev.rerun(node)                                          # doctest: +SKIP
    >>> ev.run(torch.ops.aten.mul.Tensor, (a_val, 2.0))         # doctest: +SKIP
    """

    def __init__(
        self,
        mode: Any = None,
        *,
        strictness: Strictness | str = Strictness.RAISE,
        cache: FakeResults | None = FAKE_RESULTS,
        new_mode: bool = True,
        owner: str = "fxpass",
    ) -> None:
        self.mode = mode
        self.strictness = Strictness(strictness)
        self.cache = cache
        self.new_mode = new_mode
        self.owner = owner
        #: why the latest computations gave None (``LENIENT`` and ``DECLINE``), one line each
        self.failures: deque[str] = deque(maxlen=64)

    @classmethod
    def for_graph(cls, graph: fx.Graph | fx.GraphModule, **kw: Any) -> FakeEvaluator:
        """An evaluator in the fake mode of ``graph``'s example values (a fresh permissive
        mode when they have none)."""
        graph = graph.graph if isinstance(graph, fx.GraphModule) else graph
        inputs = [*graph.find_nodes(op="placeholder"), *graph.find_nodes(op="get_attr")]
        mode = _fake_mode_of([node_val(n) for n in inputs]) or _fake_mode_of(
            [node_val(n) for n in graph.nodes]
        )
        return cls(mode or FakeTensorMode(allow_non_fake_inputs=True), **kw)

    def fake(self, value: Any) -> Any:
        """``value`` with its real tensors made fake in this evaluator's mode."""
        mode = self.mode

        def convert(v: Any) -> Any:
            if isinstance(v, torch.Tensor) and not _is_fake(v):
                return mode.from_tensor(v, static_shapes=True)
            return v

        return value if mode is None else pytree.tree_map(convert, value)

    def run(
        self,
        target: Any,
        args: Any = (),
        kwargs: Any = None,
        *,
        kind: str = "call_function",
        node: fx.Node | None = None,
        like: Any = None,
        call: Callable[[Any, Any, Any], Any] | None = None,
        layout_only: bool = False,
        prefer: Any = None,
    ) -> Any:
        """``target(*args, **kwargs)`` on fake values (``kind`` ``call_method``: a method of
        ``args[0]``). ``node`` names the node it is for, in notes; ``like`` helps find the
        fake mode of a call without tensor arguments; ``call(target, args, kwargs)`` runs
        it instead (inside a mode the caller manages) — the cache and strictness still
        apply. ``layout_only``: the caller reads only sizes, strides and dtype, so a result
        remembered from an earlier call may come back as meta tensors, without a fake mode
        or a fresh tensor (a fusion deciding on layouts at every site of one shape).
        ``prefer``: where a remembered result is used, these fake tensors (a tensor, or a
        tuple shaped like the result) stand in for fresh ones wherever they have exactly the
        remembered metadata — a rewrite's new node keeps the value of the node it replaces."""
        kwargs = {} if kwargs is None else kwargs
        cache = self.cache if kind == "call_function" else None
        if layout_only and cache is not None:
            hit = cache.get(target, args, kwargs, None, layout_only=True)
            if hit is not None:
                return hit
        try:
            mode = self._mode_for(args, kwargs, like) if call is None else self.mode
            if cache is not None:
                hit = cache.get(target, args, kwargs, mode, prefer=prefer)
                if hit is not None:
                    return hit
            if call is not None:
                out = call(target, args, kwargs)
            else:
                with mode:
                    if kind == "call_method":
                        out = getattr(args[0], target)(*args[1:], **kwargs)
                    else:
                        out = target(*args, **kwargs)
        except Exception as e:  # broad: _failed raises it, or records it as the strictness says
            return self._failed(e, target, node)
        return cache.put(target, args, kwargs, out) if cache is not None else out

    def run_on_nodes(
        self,
        target: Any,
        args: Any,
        kwargs: Any = None,
        *,
        kind: str = "call_function",
        node: fx.Node | None = None,
        like: Any = None,
        value: Callable[[fx.Node], Any] = node_val,
        prefer: Any = None,
    ) -> Any:
        """Like :meth:`run` on arguments holding nodes: each node stands for its example
        value (``value(node)``; None when it has none, which cannot say)."""
        missing: list[fx.Node] = []

        def val(n: fx.Node) -> Any:
            v = value(n)
            if v is None:
                missing.append(n)
            return v

        fargs, fkwargs = fx.node.map_arg((args, kwargs or {}), val)
        if missing:
            names = ", ".join(f"'{n.name}'" for n in missing)
            problem = ValueError(f"no example value (meta['val']) for the input(s) {names}")
            return self._failed(problem, target, node, cannot_say=True)
        return self.run(target, fargs, fkwargs, kind=kind, node=node, like=like, prefer=prefer)

    def rerun(self, node: fx.Node, value: Callable[[fx.Node], Any] = node_val) -> Any:
        """What ``node``'s op gives on its inputs' example values now."""
        kind = "call_method" if node.op == "call_method" else "call_function"
        return self.run_on_nodes(
            node.target, node.args, node.kwargs, kind=kind, node=node, value=value
        )

    # ----- helpers --------------------------------------------------------------------------
    def _mode_for(self, args: Any, kwargs: Any, like: Any) -> Any:
        if self.mode is not None:
            return self.mode
        try:
            mode = _fake_mode_of((args, kwargs, like)) or detect_fake_mode()
        except AssertionError as e:  # example values from different fake modes
            raise ValueError(f"the arguments come from different fake modes: {e}") from None
        if mode is None:
            if not self.new_mode:
                raise _CannotSay("no fake tensor mode among the arguments")
            mode = self.mode = FakeTensorMode(allow_non_fake_inputs=True)
        return mode

    def _failed(self, e: Exception, target: Any, node: fx.Node | None, cannot_say=False) -> Any:
        where = f" for %{node.name}" if node is not None else ""
        cannot_say = cannot_say or isinstance(e, (_CannotSay, *CANNOT_SAY))
        if self.strictness is Strictness.RAISE or (
            self.strictness is Strictness.DECLINE and not cannot_say
        ):
            if isinstance(e, _CannotSay):
                raise ValueError(f"{self.owner}: cannot run {target} on fake values{where}: {e}")
            e.add_note(f"({self.owner}: while running {target} on fake values{where})")
            raise e
        line = f"{target}{where}: {error_summary(e)}"
        self.failures.append(line)
        _LOG.debug("%s: no fake value: %s", self.owner, line)
        return None


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
    with ``strict``, those failures raise instead (:class:`FakeEvaluator` with
    ``Strictness.RAISE`` or ``LENIENT``)."""
    evaluator = FakeEvaluator(
        mode, strictness=Strictness.RAISE if strict else Strictness.LENIENT, cache=None
    )
    kind = "call_method" if method else "call_function"
    return evaluator.run_on_nodes(target, args, kwargs, kind=kind, like=like)
