"""Operator support: which nodes of a graph a backend can run.

A support object answers ``is_node_supported(submodules, node)`` (torch's
``OperatorSupportBase`` interface, so torch's partitioners accept fxpass's objects and fxpass's
partitioners accept torch's). Build them from an op set (:func:`op_support`: ops, packets, functions, ``nn.Module`` types), a predicate on
``meta['val']`` (:func:`dtype_support`, :func:`shape_support`), any function of the node
(:func:`node_support`) or a named set (:data:`NAMED_SUPPORTS`: ``pointwise``, ``norm``, ...);
compose them with :func:`chain`, :func:`any_chain` or the operators ``&``, ``|`` and ``~``.

Ops are matched by the ATen op they are (:func:`fxpass.fxutil.dialect.aten_op`): a support
written with ``aten.add.Tensor`` accepts ExecuTorch's Edge op ``exir_ops.edge.aten.add.Tensor``
too, and an Edge op given to a support stands for its ATen op.

:func:`parse_support` reads the declarative forms the CLI and the ``partition`` pass take::

    elementwise | norm
    ops(aten.mm, aten.addmm) & dtype(bf16, f16)
    (pointwise & !ops(aten.where)) | ops(fxpass.rms_norm)
    {"ops": ["aten.add", "aten.mul"], "dtypes": ["float32"], "max_rank": 4}
"""

from __future__ import annotations

import abc
import difflib
import operator
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch import fx, nn

from ..fxutil.dialect import aten_op
from ..fxutil.ops import (
    CONVERSION_OPS,
    NORM_OPS,
    VIEW_OPS,
    existing_ops,
    fxpass_norm_ops,
    op_name,
    resolve_op,
)
from .support_grammar import SpecTree, SupportSpecError, read_spec

__all__ = [
    "NAMED_SUPPORTS",
    "OperatorSupportBase",
    "SupportSpecError",
    "any_chain",
    "chain",
    "dtype_support",
    "named_support",
    "node_support",
    "op_support",
    "parse_support",
    "resolve_op",
    "shape_support",
]

#: The node kinds a support decides on; other nodes (placeholders, get_attr, output) are data.
CALLABLE_OPS = ("call_function", "call_module", "call_method")


class OperatorSupportBase(abc.ABC):
    """Decides whether a backend supports a node. Subclass it and implement
    :meth:`is_node_supported`; combine instances with ``&`` (all), ``|`` (any), ``~`` (not).
    """

    @abc.abstractmethod
    def is_node_supported(self, submodules: Mapping[str, nn.Module], node: fx.Node) -> bool:
        """Whether ``node`` is supported; ``submodules`` maps names to the graph's modules."""
        raise NotImplementedError

    def __call__(self, node: fx.Node, submodules: Mapping[str, nn.Module] | None = None) -> bool:
        return bool(self.is_node_supported(submodules or {}, node))

    def __and__(self, other: Any) -> OperatorSupportBase:
        return chain(self, _as_support(other))

    def __or__(self, other: Any) -> OperatorSupportBase:
        return any_chain(self, _as_support(other))

    def __invert__(self) -> OperatorSupportBase:
        return _Not(self)

    def describe(self) -> str:
        """The support as spec text (what :func:`parse_support` reads back, where it can)."""
        return f"<{type(self).__name__}>"

    def named_ops(self) -> frozenset[Any]:
        """The op overloads this support names as supported (a packet names each of its
        overloads; ops under ``~`` are not named). What a backend asks a compiler to keep
        whole, e.g. ExecuTorch's ``ops_to_not_decompose``."""
        return frozenset()

    def __repr__(self) -> str:
        return f"<support {self.describe()}>"


# torch's partitioners and isinstance checks accept fxpass's support objects.
try:  # pragma: no branch
    from torch.fx.passes.operator_support import OperatorSupportBase as _TorchBase

    _TorchBase.register(OperatorSupportBase)
except ImportError:  # pragma: no cover
    _TorchBase = None


def _as_support(obj: Any) -> OperatorSupportBase:
    if isinstance(obj, OperatorSupportBase):
        return obj
    if callable(getattr(obj, "is_node_supported", None)):
        return _Foreign(obj)
    return parse_support(obj)


class _Foreign(OperatorSupportBase):
    """A support object that is not ours (torch's, a user's duck-typed one)."""

    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def is_node_supported(self, submodules, node):
        return bool(self.obj.is_node_supported(submodules, node))

    def describe(self) -> str:
        return f"<{type(self.obj).__name__}>"


# ----- op sets ---------------------------------------------------------------------------------
class _OpSet(OperatorSupportBase):
    """Supported when the node calls one of the given ops (``call_function``) or modules."""

    def __init__(self, targets: Iterable[Any]) -> None:
        self.overloads: set[Any] = set()
        self.packets: set[Any] = set()
        self.functions: set[Any] = set()
        self.module_types: tuple[type, ...] = ()
        self.names: list[str] = []
        modules = []
        for t in targets:
            op = resolve_op(t) if isinstance(t, str) else aten_op(t)
            self.names.append(t if isinstance(t, str) else op_name(op))
            if isinstance(op, torch._ops.OpOverload):
                self.overloads.add(op)
            elif isinstance(op, torch._ops.OpOverloadPacket):
                self.packets.add(op)
            elif isinstance(op, type) and issubclass(op, nn.Module):
                modules.append(op)
            elif callable(op):
                self.functions.add(op)
            else:
                raise TypeError(f"op_support: {op!r} is not an op, a function or a module type")
        self.module_types = tuple(modules)

    def is_node_supported(self, submodules, node):
        if node.op == "call_function":
            target = aten_op(node.target)
            if target in self.overloads or target in self.functions:
                return True
            packet = getattr(target, "overloadpacket", None)
            return packet is not None and packet in self.packets
        if node.op == "call_module" and self.module_types:
            module = submodules.get(node.target) if submodules else None
            return module is not None and isinstance(module, self.module_types)
        return False

    def describe(self) -> str:
        return "ops(" + ", ".join(self.names) + ")"

    def named_ops(self) -> frozenset[Any]:
        ops = set(self.overloads)
        for packet in self.packets:
            ops.update(getattr(packet, name) for name in packet.overloads())
        return frozenset(ops)


def op_support(*targets: Any) -> OperatorSupportBase:
    """Supported when the node calls one of ``targets``: op overloads (``aten.add.Tensor``),
    packets (``aten.add``: every overload), functions (``operator.getitem``), module types
    (for ``call_module`` nodes), or their names as strings."""
    if len(targets) == 1 and isinstance(targets[0], (list, tuple, set, frozenset)):
        targets = tuple(targets[0])
    return _OpSet(targets)


# ----- values ---------------------------------------------------------------------------------
_DTYPE_ALIASES = {
    "bf16": torch.bfloat16,
    "f16": torch.float16,
    "half": torch.float16,
    "fp16": torch.float16,
    "f32": torch.float32,
    "fp32": torch.float32,
    "float": torch.float32,
    "f64": torch.float64,
    "double": torch.float64,
    "i8": torch.int8,
    "u8": torch.uint8,
    "i32": torch.int32,
    "int": torch.int32,
    "i64": torch.int64,
    "long": torch.int64,
    "bool": torch.bool,
}


def _dtype(value: Any) -> torch.dtype:
    if isinstance(value, torch.dtype):
        return value
    text = str(value).strip().removeprefix("torch.")
    dtype = _DTYPE_ALIASES.get(text) or getattr(torch, text, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype '{value}' (write e.g. bfloat16, bf16, float32, int8)")
    return dtype


def _tensors(value: Any) -> list[Any]:
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return [value] if isinstance(value, torch.Tensor) else []


def _value_tensors(node: fx.Node) -> list[Any] | None:
    """The tensors a node computes, from ``meta['val']`` (or ``tensor_meta``); None: unknown."""
    if "val" in node.meta:
        return _tensors(node.meta["val"])
    meta = node.meta.get("tensor_meta")
    if meta is not None:
        return [meta] if hasattr(meta, "dtype") else [m for m in meta if hasattr(m, "dtype")]
    return None


class _Dtype(OperatorSupportBase):
    def __init__(self, dtypes: Iterable[Any], inputs: bool, unknown: bool) -> None:
        self.dtypes = frozenset(_dtype(d) for d in dtypes)
        self.inputs = inputs
        self.unknown = unknown

    def _ok(self, node: fx.Node) -> bool:
        tensors = _value_tensors(node)
        if not tensors:  # no meta, or no tensor in it
            return self.unknown
        return all(t.dtype in self.dtypes for t in tensors)

    def is_node_supported(self, submodules, node):
        if not self.inputs:
            return self._ok(node)
        return all(self._ok(arg) for arg in node.all_input_nodes)

    def describe(self) -> str:
        name = "input_dtype" if self.inputs else "dtype"
        return (
            f"{name}(" + ", ".join(sorted(str(d).removeprefix("torch.") for d in self.dtypes)) + ")"
        )


def dtype_support(*dtypes: Any, inputs: bool = False, unknown: bool = False) -> OperatorSupportBase:
    """Supported when every tensor the node computes (``inputs=True``: every tensor it reads)
    has one of ``dtypes`` (``torch.bfloat16`` or names like ``"bf16"``); nodes whose
    ``meta['val']`` is missing or holds no tensor count as ``unknown``."""
    if len(dtypes) == 1 and isinstance(dtypes[0], (list, tuple, set, frozenset)):
        dtypes = tuple(dtypes[0])
    return _Dtype(dtypes, inputs, unknown)


class _Shape(OperatorSupportBase):
    def __init__(self, predicate, max_rank, static, unknown, text) -> None:
        self.predicate = predicate
        self.max_rank = max_rank
        self.static = static
        self.unknown = unknown
        self.text = text

    def is_node_supported(self, submodules, node):
        tensors = _value_tensors(node)
        if not tensors:  # no meta, or no tensor in it
            return self.unknown
        for t in tensors:
            shape = tuple(t.shape)
            if self.max_rank is not None and len(shape) > self.max_rank:
                return False
            if self.static and not all(isinstance(s, int) for s in shape):
                return False
            if self.predicate is not None and not self.predicate(shape):
                return False
        return True

    def describe(self) -> str:
        return self.text


def shape_support(
    predicate: Callable[[tuple], bool] | None = None,
    *,
    max_rank: int | None = None,
    static: bool = False,
    unknown: bool = False,
) -> OperatorSupportBase:
    """Supported when every tensor the node computes has a shape that passes: rank at most
    ``max_rank``, only integer sizes when ``static``, and ``predicate(shape)``."""
    parts = []
    if max_rank is not None:
        parts.append(f"max_rank({max_rank})")
    if static:
        parts.append("static_shape")
    if predicate is not None:
        parts.append(f"shape({getattr(predicate, '__name__', 'predicate')})")
    return _Shape(predicate, max_rank, static, unknown, " & ".join(parts) or "all")


class _Function(OperatorSupportBase):
    def __init__(self, fn: Callable[..., bool], takes_submodules: bool) -> None:
        self.fn = fn
        self.takes_submodules = takes_submodules

    def is_node_supported(self, submodules, node):
        if self.takes_submodules:
            return bool(self.fn(submodules, node))
        return bool(self.fn(node))

    def describe(self) -> str:
        return f"<{getattr(self.fn, '__name__', 'function')}>"


def node_support(fn: Callable[..., bool], *, takes_submodules: bool = False) -> OperatorSupportBase:
    """A support object from a function ``fn(node) -> bool`` (or ``fn(submodules, node)``
    with ``takes_submodules=True``, torch's ``create_op_support`` form)."""
    return _Function(fn, takes_submodules)


# ----- composition ------------------------------------------------------------------------------
class _All(OperatorSupportBase):
    def __init__(self, parts: Iterable[OperatorSupportBase]) -> None:
        self.parts = [_as_support(p) for p in parts]

    def is_node_supported(self, submodules, node):
        return all(p.is_node_supported(submodules, node) for p in self.parts)

    def describe(self) -> str:
        return " & ".join(_paren(p, _Any) for p in self.parts) or "all"

    def named_ops(self) -> frozenset[Any]:
        return frozenset().union(*(p.named_ops() for p in self.parts))


class _Any(OperatorSupportBase):
    def __init__(self, parts: Iterable[OperatorSupportBase]) -> None:
        self.parts = [_as_support(p) for p in parts]

    def is_node_supported(self, submodules, node):
        return any(p.is_node_supported(submodules, node) for p in self.parts)

    def describe(self) -> str:
        return " | ".join(_paren(p, _All) for p in self.parts) or "none"

    def named_ops(self) -> frozenset[Any]:
        return frozenset().union(*(p.named_ops() for p in self.parts))


class _Not(OperatorSupportBase):
    def __init__(self, part: OperatorSupportBase) -> None:
        self.part = part

    def is_node_supported(self, submodules, node):
        return not self.part.is_node_supported(submodules, node)

    def describe(self) -> str:
        return "!" + _paren(self.part, (_All, _Any))


def _paren(part: OperatorSupportBase, kinds: Any) -> str:
    text = part.describe()
    return f"({text})" if isinstance(part, kinds) else text


def chain(*op_support: Any) -> OperatorSupportBase:
    """Supported when every one of ``op_support`` says so (torch's ``chain``)."""
    return _All(op_support)


def any_chain(*op_support: Any) -> OperatorSupportBase:
    """Supported when any one of ``op_support`` says so (torch's ``any_chain``)."""
    return _Any(op_support)


# ----- named sets -------------------------------------------------------------------------------
class _Tagged(OperatorSupportBase):
    """ATen-style ops carrying a tag (``torch.Tag.pointwise``), plus extra ops."""

    def __init__(self, name: str, tag: Any, extra: Iterable[Any] = ()) -> None:
        self.name = name
        self.tag = tag
        self.extra = _OpSet(extra) if extra else None
        self._cache: dict[Any, bool] = {}

    def is_node_supported(self, submodules, node):
        if node.op != "call_function":
            return False
        target = node.target
        hit = self._cache.get(target)
        if hit is None:
            tags = getattr(target, "tags", ())
            hit = self.tag is not None and self.tag in tags
            if not hit and self.extra is not None:
                hit = self.extra.is_node_supported(submodules, node)
            self._cache[target] = hit
        return hit

    def describe(self) -> str:
        return self.name


class _Constant(OperatorSupportBase):
    def __init__(self, value: bool) -> None:
        self.value = value

    def is_node_supported(self, submodules, node):
        return self.value and node.op in CALLABLE_OPS

    def describe(self) -> str:
        return "all" if self.value else "none"


def _named(name: str) -> OperatorSupportBase:
    if name == "pointwise":
        return _Tagged("pointwise", torch.Tag.pointwise)
    if name == "elementwise":
        return _Tagged("elementwise", torch.Tag.pointwise, existing_ops(CONVERSION_OPS))
    if name == "norm":
        return _Tagged("norm", None, existing_ops(NORM_OPS) + fxpass_norm_ops())
    if name == "view":
        return _Tagged("view", None, existing_ops(VIEW_OPS))
    if name == "getitem":
        return _Tagged("getitem", None, [operator.getitem])
    if name in ("all", "none"):
        return _Constant(name == "all")
    raise KeyError(name)


#: The named supports :func:`parse_support` knows, with what each one accepts.
NAMED_SUPPORTS: dict[str, str] = {
    "pointwise": "ops tagged torch.Tag.pointwise (add, mul, rsqrt, where, ...)",
    "elementwise": "pointwise ops plus dtype conversions (_to_copy, to, type_as, clone)",
    "norm": "the ops norms decompose to or fuse into (mean, var_mean, native_layer_norm, "
    "rms_norm, fxpass.rms_norm, ...)",
    "view": "view-like ops (view, reshape, permute, expand, slice, getitem, ...)",
    "getitem": "operator.getitem",
    "all": "every call_function / call_module / call_method node",
    "none": "no node",
}


def named_support(name: str) -> OperatorSupportBase:
    """The named support ``name`` (one of :data:`NAMED_SUPPORTS`)."""
    try:
        return _named(name)
    except KeyError:
        close = difflib.get_close_matches(name, list(NAMED_SUPPORTS), n=2)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ValueError(
            f"unknown named support '{name}'{hint} (known: {', '.join(NAMED_SUPPORTS)})"
        ) from None


# ----- declarative forms --------------------------------------------------------------------------
def parse_support(spec: Any) -> OperatorSupportBase:
    """Build a support object from a declarative spec.

    ``spec`` is a support object (returned as is), a string in the spec language, a dict, or a
    list of op names (any of them). The string language (grammar in :mod:`~fxpass.partition.support_grammar`)::

        expr  := term ("|" term)*           any of
        term  := factor ("&" factor)*       all of
        factor:= ("!" | "not") factor | "(" expr ")" | atom
        atom  := NAMED | OP | ops(OP, ...) | dtype(DT, ...) | input_dtype(DT, ...)
               | max_rank(N) | static_shape

    ``NAMED`` is one of :data:`NAMED_SUPPORTS`; ``OP`` is an op name (``aten.add.Tensor``,
    ``aten.add``, ``fxpass.rms_norm``, ``operator.getitem``). The dict form: ``ops`` (list of
    op names) and ``named`` (list of named supports) are OR-ed together; ``exclude_ops``,
    ``dtypes``, ``input_dtypes``, ``max_rank``, ``static_shapes``, ``all`` (list of specs),
    ``any`` (list of specs) and ``not`` (a spec) then restrict it.
    """
    if isinstance(spec, OperatorSupportBase):
        return spec
    if callable(getattr(spec, "is_node_supported", None)):
        return _Foreign(spec)
    if isinstance(spec, str):
        return _build(read_spec(spec), spec)
    if isinstance(spec, Mapping):
        return _from_dict(spec)
    if isinstance(spec, (list, tuple, set, frozenset)):
        return op_support(*spec)
    raise TypeError(
        f"cannot make operator support from {spec!r}: give a support object, a spec string "
        "like 'elementwise | ops(aten.mm)', a dict, or a list of op names"
    )


_DICT_KEYS = (
    "ops",
    "named",
    "exclude_ops",
    "dtypes",
    "input_dtypes",
    "max_rank",
    "static_shapes",
    "all",
    "any",
    "not",
)


def _from_dict(spec: Mapping[str, Any]) -> OperatorSupportBase:
    for key in spec:
        if key not in _DICT_KEYS:
            close = difflib.get_close_matches(str(key), _DICT_KEYS, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise SupportSpecError(
                f"unknown key '{key}' in support dict{hint} (keys: {', '.join(_DICT_KEYS)})",
                str(dict(spec)),
                1,
            )
    selectors: list[OperatorSupportBase] = []
    if "ops" in spec:
        selectors.append(op_support(*_listed(spec["ops"])))
    selectors += [named_support(n) for n in _listed(spec.get("named", ()))]
    parts: list[OperatorSupportBase] = []
    if selectors:
        parts.append(selectors[0] if len(selectors) == 1 else any_chain(*selectors))
    if "exclude_ops" in spec:
        parts.append(~op_support(*_listed(spec["exclude_ops"])))
    if "dtypes" in spec:
        parts.append(dtype_support(*_listed(spec["dtypes"])))
    if "input_dtypes" in spec:
        parts.append(dtype_support(*_listed(spec["input_dtypes"]), inputs=True))
    if "max_rank" in spec or spec.get("static_shapes"):
        parts.append(
            shape_support(max_rank=spec.get("max_rank"), static=bool(spec.get("static_shapes")))
        )
    parts += [parse_support(s) for s in spec.get("all", ())]
    if "any" in spec:
        parts.append(any_chain(*(parse_support(s) for s in spec["any"])))
    if "not" in spec:
        parts.append(~parse_support(spec["not"]))
    if not parts:
        return _Constant(False)
    return parts[0] if len(parts) == 1 else chain(*parts)


def _listed(value: Any) -> list[Any]:
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    return list(value)


def _build(tree: SpecTree, text: str) -> OperatorSupportBase:
    kind = tree[0]
    if kind == "any":
        return any_chain(*(_build(t, text) for t in tree[1]))
    if kind == "all":
        return chain(*(_build(t, text) for t in tree[1]))
    if kind == "not":
        return ~_build(tree[1], text)
    _, name, args, start = tree
    try:
        return _atom(name, args)
    except (ValueError, TypeError) as e:
        raise SupportSpecError(str(e), text, start + 1) from None


def _atom(name: str, args: list[str] | None) -> OperatorSupportBase:
    if args is None:
        if name == "static_shape":
            return shape_support(static=True)
        if name in NAMED_SUPPORTS:
            return named_support(name)
        if "." in name:
            return op_support(name)
        close = difflib.get_close_matches(name, [*NAMED_SUPPORTS, "static_shape"], n=2)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ValueError(
            f"unknown support '{name}'{hint} (named: {', '.join(NAMED_SUPPORTS)}; "
            "or an op like aten.add.Tensor, or ops(...), dtype(...), max_rank(N))"
        )
    if name == "ops":
        return op_support(*args)
    if name == "dtype":
        return dtype_support(*args)
    if name == "input_dtype":
        return dtype_support(*args, inputs=True)
    if name == "max_rank":
        if len(args) != 1 or not args[0].isdigit():
            raise ValueError("max_rank takes one integer, e.g. max_rank(4)")
        return shape_support(max_rank=int(args[0]))
    raise ValueError(
        f"unknown support function '{name}' (known: ops, dtype, input_dtype, max_rank)"
    )
