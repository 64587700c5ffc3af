"""Who writes which memory, and which values share it: the analysis the cleanup passes share.

Passes that drop copies, merge nodes or turn in-place ops into functional ones are only
correct when no mutation or alias can observe the difference. This module answers those
questions from the op schemas' alias annotations (``Tensor(a!)`` is written, ``Tensor(a)``
is aliased by the output), so it knows every ATen and custom op without a hand-kept list.
Python-level calls (Dynamo graphs) are judged by their names: a trailing underscore
(``add_``), ``operator.setitem``, ``inplace=True`` or ``out=`` write; a list of view-making
names alias.

The analysis is a snapshot of the graph: rebuild it after changing the graph, or tell it
what changed — :meth:`AliasInfo.forget` a node that went, :meth:`AliasInfo.replace` a value
whose uses now read another (the analysis manager does this for each change made through
the editor, see :mod:`fxpass.core.analyses`).
"""

from __future__ import annotations

import functools
import operator
from typing import Any

import torch
from torch import fx

from ..fxutil.dialect import aten_op
from ..fxutil.fx import is_erased
from ..fxutil.values import node_val

__all__ = [
    "FUNCTIONAL_HOPS",
    "AliasInfo",
    "aliased_args",
    "hop_name",
    "lay_out_args",
    "nodes_in",
    "op_schema",
    "write_slots",
    "written_args",
]

# names of Python-level tensor methods / torch functions whose result may share memory with
# their first argument (Dynamo and symbolic_trace graphs call these)
_VIEW_NAMES = frozenset(
    [
        "view",
        "view_as",
        "reshape",
        "reshape_as",
        "transpose",
        "permute",
        "expand",
        "expand_as",
        "unsqueeze",
        "squeeze",
        "flatten",
        "unflatten",
        "contiguous",
        "to",
        "float",
        "half",
        "bfloat16",
        "double",
        "int",
        "long",
        "bool",
        "type",
        "type_as",
        "detach",
        "narrow",
        "select",
        "split",
        "split_with_sizes",
        "chunk",
        "unbind",
        "as_strided",
        "diagonal",
        "movedim",
        "swapaxes",
        "swapdims",
        "t",
        "T",
        "mT",
        "H",
        "mH",
        "real",
        "imag",
        "__getitem__",
        "getitem",
        "alias",
        "view_as_real",
        "view_as_complex",
        "unfold",
    ]
)
_INPLACE_OPERATORS = frozenset(
    getattr(operator, n)
    for n in [
        "setitem",
        "iadd",
        "isub",
        "imul",
        "itruediv",
        "ifloordiv",
        "imod",
        "ipow",
        "iand",
        "ior",
        "ixor",
        "ilshift",
        "irshift",
        "imatmul",
    ]
)
FUNCTIONAL_HOPS = ("auto_functionalized", "auto_functionalized_v2")


def op_schema(node: fx.Node) -> torch.FunctionSchema | None:
    """The schema of an ``OpOverload`` call (an Edge op's too), else None."""
    if node.op == "call_function" and isinstance(aten_op(node.target), torch._ops.OpOverload):
        return node.target._schema
    return None


def lay_out_args(schema: torch.FunctionSchema, named: dict[str, Any]) -> tuple[list, dict]:
    """``(args, kwargs)`` for a call of ``schema`` with the arguments ``named``: in order by
    position, keyword-only ones by name, and after a missing (defaulted) one all by name."""
    args, kwargs, gap = [], {}, False
    for arg in schema.arguments:
        if arg.name not in named:
            gap = True  # later positional arguments must go by name
        elif arg.kwarg_only or gap:
            kwargs[arg.name] = named[arg.name]
        else:
            args.append(named[arg.name])
    return args, kwargs


_Slots = tuple[tuple[int, str, bool], ...]  # (position, name, keyword-only) per argument


@functools.cache
def write_slots(op: torch._ops.OpOverload) -> _Slots:
    """The arguments of ``op`` it writes (``Tensor(a!)``), cached per op."""
    return tuple(
        (i, a.name, a.kwarg_only)
        for i, a in enumerate(op._schema.arguments)
        if a.alias_info is not None and a.alias_info.is_write
    )


@functools.cache
def _alias_slots(op: torch._ops.OpOverload) -> _Slots:
    """The arguments of ``op`` whose memory its results may share, cached per op."""
    schema = op._schema
    sets = set()
    for ret in schema.returns:
        if ret.alias_info is not None:
            sets |= set(ret.alias_info.after_set) | set(ret.alias_info.before_set)
    return tuple(
        (i, a.name, a.kwarg_only)
        for i, a in enumerate(schema.arguments)
        if sets and a.alias_info is not None and sets & set(a.alias_info.before_set)
    )


def _slot_nodes(node: fx.Node, slots: _Slots) -> list[fx.Node]:
    out: list[fx.Node] = []
    for i, name, kwarg_only in slots:
        if i < len(node.args) and not kwarg_only:
            fx.node.map_arg(node.args[i], out.append)
        elif name in node.kwargs:
            fx.node.map_arg(node.kwargs[name], out.append)
    return out


def nodes_in(value: Any) -> list[fx.Node]:
    """The nodes inside an argument (nested lists, tuples and dicts)."""
    out: list[fx.Node] = []
    fx.node.map_arg(value, out.append)
    return out


def _name(node: fx.Node) -> str:
    if node.op == "call_method":
        return str(node.target)
    return getattr(node.target, "__name__", "") if node.op == "call_function" else ""


def hop_name(node: fx.Node) -> str | None:
    if node.op == "call_function" and isinstance(node.target, torch._ops.HigherOrderOperator):
        return node.target.name()
    return None


def written_args(node: fx.Node) -> list[fx.Node]:
    """The nodes whose memory ``node`` writes (in-place ops, ``out=``, ``copy_``, setitem)."""
    if op_schema(node) is not None:
        return _slot_nodes(node, write_slots(aten_op(node.target)))
    if node.op not in ("call_function", "call_method", "call_module") or hop_name(node):
        return []
    first = node.args[0] if node.args and isinstance(node.args[0], fx.Node) else None
    name = _name(node)
    if node.op == "call_module":
        mod = node.graph.owning_module
        sub = mod.get_submodule(node.target) if mod is not None else None
        inplace = bool(getattr(sub, "inplace", False))
        return [first] if inplace and first is not None else []
    if node.target in _INPLACE_OPERATORS or node.kwargs.get("inplace") is True:
        is_tensor = isinstance(node_val(first), torch.Tensor) or node.target is operator.setitem
        return [first] if first is not None and is_tensor else []
    if "out" in node.kwargs:
        return nodes_in(node.kwargs["out"])
    if name.endswith("_") and not name.endswith("__") and first is not None:
        return [first]
    return []


def aliased_args(node: fx.Node) -> list[fx.Node]:
    """The input nodes whose memory ``node``'s result may share (views, in-place results)."""
    if op_schema(node) is not None:
        return _slot_nodes(node, _alias_slots(aten_op(node.target)))
    if node.op == "call_function" and node.target is operator.getitem:
        return nodes_in(node.args[0])
    hop = hop_name(node)
    if hop in FUNCTIONAL_HOPS:
        return []
    if node.op == "call_module" or hop is not None:
        return nodes_in((node.args, node.kwargs))  # opaque: assume the worst
    views = _name(node) in _VIEW_NAMES or written_args(node)
    if node.op in ("call_function", "call_method") and views:
        return nodes_in(node.args[:1])
    return []


class AliasInfo:
    """Memory facts about one graph: each node's storage roots, who writes them, and when.

    A node's *roots* are the nodes whose memory its value may share (itself included): a
    view's roots are its base's, a fresh result's root is the node itself.
    """

    def __init__(self, graph: fx.Graph) -> None:
        self.graph = graph
        self.pos: dict[fx.Node, int] = {}
        self._roots: dict[fx.Node, frozenset[fx.Node]] = {}
        self.output: fx.Node | None = None
        self._by_root: dict[fx.Node, list[fx.Node]] = {}
        # the nodes that write memory, in graph order, each with the roots it writes
        self.written_by: dict[fx.Node, frozenset[fx.Node]] = {}
        for i, node in enumerate(graph.nodes):
            self.pos[node] = i
            roots = {node}
            for base in aliased_args(node):
                roots |= self._roots.get(base, {base})
            self._roots[node] = frozenset(roots)
            for r in roots:
                self._by_root.setdefault(r, []).append(node)
            written = frozenset().union(*(self.roots(w) for w in written_args(node)))
            if written:
                self.written_by[node] = written
            if node.op == "output":
                self.output = node

    def forget(self, node: fx.Node) -> None:
        """Drop a node nothing uses (erased, or about to be): no other value shares its
        memory through it, and a write it made is gone with it."""
        for r in self._roots.pop(node, ()):
            holders = self._by_root.get(r)
            if holders is not None and node in holders:
                holders.remove(node)
        self._by_root.pop(node, None)
        self.pos.pop(node, None)
        self.written_by.pop(node, None)
        if self.output is node:
            self.output = None

    def replace(self, old: fx.Node, new: fx.Node) -> bool:
        """Take in that ``old``'s users now read ``new`` (and ``old`` may be erased): the
        values that shared ``old``'s memory through those uses, and the writes into them,
        now reach ``new``'s. False when either node is not in the snapshot (rebuild it)."""
        if old not in self.pos or new not in self.pos:
            return False
        affected = sorted(
            (a for a in self._by_root.get(old, ()) if a is not old), key=self.pos.__getitem__
        )
        for a in affected:  # bases before their views: graph order
            roots = {a}
            for base in aliased_args(a):
                roots |= self._roots.get(base, {base})
            was = self._roots[a]
            for r in was - roots:
                self._by_root[r].remove(a)
            for r in roots - was:
                self._by_root.setdefault(r, []).append(a)
            self._roots[a] = frozenset(roots)
        for writer, written in list(self.written_by.items()):
            if old in written and writer is not old:
                args = written_args(writer)
                self.written_by[writer] = frozenset().union(*(self.roots(w) for w in args))
        if is_erased(old):
            self.forget(old)
        return True

    def roots(self, node: Any) -> frozenset[fx.Node]:
        """The nodes whose memory ``node``'s value may share (itself included)."""
        if not isinstance(node, fx.Node):
            return frozenset()
        return self._roots.get(node, frozenset({node}))

    def written(
        self,
        roots: frozenset[fx.Node],
        after: int = -1,
        before: float = float("inf"),
        ignore: fx.Node | None = None,
    ) -> bool:
        """Does any node strictly between positions ``after`` and ``before`` write ``roots``?"""
        return any(
            after < self.pos[node] < before and node is not ignore and written & roots
            for node, written in self.written_by.items()
        )

    def aliases(self, roots: frozenset[fx.Node]) -> list[fx.Node]:
        """Every node whose value may share memory with ``roots``."""
        found = dict.fromkeys(n for r in roots for n in self._by_root.get(r, ()))
        return list(found)

    def last_read(self, roots: frozenset[fx.Node]) -> float:
        """Position of the last node reading memory of ``roots``: inf if the output does, or
        a node added after the snapshot (its place is unknown: assume it reads last)."""
        last = -1.0
        for alias in self.aliases(roots):
            for user in alias.users:
                at = None if user.op == "output" else self.pos.get(user)
                last = max(last, float("inf") if at is None else at)
        return last

    def external(self, roots: frozenset[fx.Node]) -> bool:
        """Is any of ``roots`` memory the caller can see (an input, parameter or buffer)?"""
        return any(r.op in ("placeholder", "get_attr") for r in roots)

    def escapes(self, roots: frozenset[fx.Node]) -> bool:
        """Does memory of ``roots`` reach the graph's output?"""
        if self.output is None:
            return False
        return any(self.roots(n) & roots for n in self.output.all_input_nodes)
