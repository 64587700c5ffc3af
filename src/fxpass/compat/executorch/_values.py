"""The values of the graph an :class:`ExportPass` builds, and the metadata of its nodes.

:class:`ProxyValue` (ExecuTorch's, and the interpreter's) pairs a fake value with the proxy
or node computing it; :func:`fake_data` and :func:`node_arg` turn arguments holding them into
fake values and into node arguments; :func:`traced_meta` gives a node made while
interpreting another the metadata torch's tracer and ExecuTorch would give it.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from executorch.exir import pass_base as _et
from torch import fx
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


def fake_data(a: Any) -> Any:
    """``a`` with every ``ProxyValue`` replaced by its data (ExecuTorch's
    ``tree_map_only(ProxyValue, lambda x: x.data, ...)``, for the common containers)."""
    cls = type(a)
    if cls in _LITERALS:
        return a
    if isinstance(a, _et.ProxyValue):
        return a.data
    if cls in _SEQUENCES:
        return cls(fake_data(x) for x in a)
    if cls is dict:
        return {k: fake_data(v) for k, v in a.items()}
    return pytree.tree_map_only(_et.ProxyValue, lambda x: x.data, a)


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
    if cls in (dict, fx.immutable_collections.immutable_dict):
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
