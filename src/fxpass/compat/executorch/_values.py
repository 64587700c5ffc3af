"""The values of the graph an :class:`ExportPass` builds, and the metadata of its nodes.

:class:`ProxyValue` (ExecuTorch's, and the interpreter's) pairs a fake value with the proxy
or node computing it; :func:`fake_data` and :func:`node_arg` turn arguments holding them into
fake values and into node arguments; :func:`traced_meta` gives a node made while
interpreting another the metadata torch's tracer and ExecuTorch would give it,
:func:`set_value_meta` the ``val`` / ``tensor_meta`` ExecuTorch's tracer gives it, and
:func:`settle_metadata` the same to a graph a pass kept as it was.
"""

from __future__ import annotations

import copy
import operator
from collections.abc import Callable
from typing import Any

import torch
from executorch.exir import pass_base as _et
from executorch.exir.error import ExportError, ExportErrorType
from torch import fx
from torch._subclasses.fake_tensor import FakeTensor
from torch.fx import traceback as fx_traceback
from torch.fx.proxy import _COPY_META_FIELDS
from torch.utils import _pytree as pytree

from ...edit.provenance import node_sources
from ...interpret import ProxyValue as _InterpreterValue

__all__ = [
    "ProxyValue",
    "RawInput",
    "created_from",
    "fake_data",
    "is_symbolic",
    "node_arg",
    "preserve_placeholder_values",
    "proxies",
    "set_value_meta",
    "settle_metadata",
    "traced_meta",
]

_INTERPRETER = "Interpreter_ExportInterpreter"  # the pass name torch records in from_node
_PRESERVE_SYM = torch.fx.traceback._is_preserving_node_seq_nr


class ProxyValue(_et.ProxyValue, _InterpreterValue):
    """A value of the graph being built: ``data`` (a fake tensor, SymInt, ...) and the
    ``proxy`` (or node) that computes it. ExecuTorch's ``ProxyValue``, and a subclass of it."""

    def __init__(self, data: Any, proxy: fx.Proxy | fx.Node) -> None:
        self.data = data
        self.proxy_or_node = proxy
        self._copy = False
        self._exact = False

    def __repr__(self) -> str:
        return f"ProxyValue({self.data!r}, {self.node.name})"


class RawInput(Exception):
    """An input is not a value of the new graph (an attribute): build the node the slow way."""


_LITERALS = frozenset(
    (
        int,
        float,
        bool,
        str,
        type(None),
        torch.dtype,
        torch.device,
        torch.memory_format,
        torch.layout,
    )
)
_SEQUENCES = frozenset((tuple, list, fx.immutable_collections.immutable_list))
_MAPPINGS = frozenset((dict, fx.immutable_collections.immutable_dict))


def _each_proxy_value(a: Any, get: Callable[[Any], Any]) -> Any:
    """``a`` with every ``ProxyValue`` replaced by ``get(value)``: the common containers
    walked directly, anything else through pytree (ExecuTorch's ``tree_map_only``)."""
    cls = type(a)
    if cls in _LITERALS:
        return a
    if isinstance(a, _et.ProxyValue):
        return get(a)
    if cls in _SEQUENCES:
        return cls(_each_proxy_value(x, get) for x in a)
    if cls in _MAPPINGS:  # a node's kwargs are an immutable_dict
        return cls((k, _each_proxy_value(v, get)) for k, v in a.items())
    if isinstance(a, torch.Tensor):
        return a
    return pytree.tree_map_only(_et.ProxyValue, get, a)


_DATA = operator.attrgetter("data")
_PROXY = operator.attrgetter("proxy")


def fake_data(a: Any) -> Any:
    """``a`` with every ``ProxyValue`` replaced by its data (ExecuTorch's
    ``tree_map_only(ProxyValue, lambda x: x.data, ...)``)."""
    return _each_proxy_value(a, _DATA)


def proxies(a: Any) -> Any:
    """``a`` with every ``ProxyValue`` replaced by its proxy (ExecuTorch's
    ``tree_map_only(ProxyValue, lambda x: x.proxy, ...)``)."""
    return _each_proxy_value(a, _PROXY)


def node_arg(a: Any) -> Any:
    """``a`` as node arguments: graph values become their nodes, literals stay; anything
    else raises ``RawInput`` (the tracer decides what it becomes)."""
    cls = type(a)
    if cls in _LITERALS:
        return a
    if cls is ProxyValue:
        proxy = a.proxy_or_node
        return proxy.node if type(proxy) is fx.Proxy else a.node
    if cls in _SEQUENCES:
        items = [node_arg(x) for x in a]
        return tuple(items) if cls is tuple else items
    if cls in _MAPPINGS:
        return {k: node_arg(v) for k, v in a.items()}
    if isinstance(a, _et.ProxyValue):
        return a.node
    raise RawInput


def traced_meta(current: fx.Node | None, data: dict[str, Any], meta: dict) -> None:
    """Fill ``meta`` as torch's tracer and ExecuTorch fill a node made while interpreting
    ``current``: the fields torch copies from the running node, then ``data``."""
    if fx_traceback.has_preserved_node_meta():
        running = current.meta if current is not None else {}
        if running and not data.keys() >= running.keys():  # usually data copies running
            stack_trace = running.get("stack_trace")
            if stack_trace and "stack_trace" not in data:
                meta["stack_trace"] = stack_trace
            for field in _COPY_META_FIELDS:
                if field in data or field not in running:
                    continue
                if field == "from_node":
                    meta[field] = created_from(current)
                else:
                    meta[field] = copy.copy(running[field])
        if "seq_nr" not in data:
            seq = running.get("seq_nr") if _PRESERVE_SYM() else None
            meta["seq_nr"] = seq if seq is not None else torch.autograd._get_sequence_nr() - 1
    meta.update(data)


def created_from(node: fx.Node) -> list[Any]:
    """torch's ``from_node`` for a node created while interpreting ``node`` (its history is
    shared, not deep-copied as ``NodeSource`` does: recorded sources are never edited)."""
    (source,) = node_sources([node], _INTERPRETER)
    source.action = [fx_traceback.NodeSourceAction.CREATE]
    return [source]


def is_symbolic(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return value._has_symbolic_sizes_strides
    if isinstance(value, (list, tuple)):
        return any(map(is_symbolic, value))
    return isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool))


def set_value_meta(tracer: Any, node: fx.Node, value: Any) -> None:
    """``val`` and ``tensor_meta`` as ExecuTorch's tracer sets them for a node computing
    ``value`` (``set_metadata``), without its tree walks for fake values."""
    if isinstance(value, (FakeTensor, int, float, bool, torch.SymInt)) or value is None:
        node.meta["val"] = value
        node.meta["tensor_meta"] = None
    elif isinstance(value, (list, tuple)) and all(isinstance(v, FakeTensor) for v in value):
        node.meta["val"] = value
        node.meta["tensor_meta"] = type(value)(None for _ in value)
    else:  # real tensors become fake ones, and the like
        tracer.set_metadata(node, value)


def _output_value(node: fx.Node) -> Any:
    return fx.node.map_arg(node.args[0], lambda n: n.meta.get("val"))


def settle_metadata(gm: fx.GraphModule, tracer: Any) -> None:
    """A graph kept as it was gets the metadata ExecuTorch's rebuild would give it: every
    ``call_function`` and the output node the ``val`` / ``tensor_meta`` of its value (later
    passes of ExecuTorch's lowering read them). Nodes already so are skipped."""
    for node in gm.graph.nodes:
        op = node.op
        if op == "call_function":
            meta = node.meta
            value = meta["val"]
            if type(value) is FakeTensor and "tensor_meta" in meta and meta["tensor_meta"] is None:
                continue
        elif op == "output":
            value = _output_value(node)
            if _same_items(node.meta.get("val"), value) and "tensor_meta" in node.meta:
                continue  # keep the very objects: a later check sees nothing changed
        else:
            continue
        set_value_meta(tracer, node, value)


def _same_items(old: Any, new: Any) -> bool:
    """``old`` is ``new``'s container type holding the very same objects."""
    if type(old) is not type(new) or not isinstance(new, (list, tuple)) or len(old) != len(new):
        return False
    return all(a is b for a, b in zip(old, new))


def preserve_placeholder_values(gm: fx.GraphModule, new_gm: fx.GraphModule) -> None:
    """The inputs keep their original ``meta['val']`` (ExecuTorch's
    ``preserve_original_ph_meta_val``); a pass may not add, drop or resize inputs."""
    old_phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    new_phs = [n for n in new_gm.graph.nodes if n.op == "placeholder"]
    message = "ExportPassBase doesn't support changing the placeholders"
    if len(old_phs) != len(new_phs):
        raise ExportError(ExportErrorType.NOT_SUPPORTED, message)
    for ph, new_ph in zip(old_phs, new_phs):
        new_val, val = new_ph.meta["val"], ph.meta["val"]
        if isinstance(new_val, torch.Tensor) and (
            not isinstance(val, torch.Tensor) or new_val.size() != val.size()
        ):
            raise ExportError(ExportErrorType.NOT_SUPPORTED, message)
        new_ph.meta["val"] = ph.meta["val"]
