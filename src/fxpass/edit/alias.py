"""Who writes which memory, and which values share it: the analysis the cleanup passes share.

Passes that drop copies, merge nodes or turn in-place ops into functional ones are only
correct when no mutation or alias can observe the difference. This module answers those
questions from the op schemas' alias annotations (``Tensor(a!)`` is written, ``Tensor(a)``
is aliased by the output), so it knows every ATen and custom op without a hand-kept list.
Python-level calls (Dynamo graphs) are judged by their names: a trailing underscore
(``add_``), ``operator.setitem``, ``inplace=True`` or ``out=`` write; a list of view-making
names alias.

Schemas only say what *may* alias: ``reshape``, ``flatten``, ``contiguous`` and ``to`` return
``Tensor(a)`` but copy when the input's layout asks for it (a reshape of an ``expand`` does).
:func:`node_memory` decides what a node actually does — a view (no kernel, its result is its
input's memory), a copy or other kernel (fresh memory), an in-place write, or unknown —
from values: a traced ``meta['val']`` that shares storage with an input's is a view; else
torch's own kernel on meta tensors of the input's layout decides
(:func:`fxpass.fxutil.views.returns_view`); where neither can tell (no value, symbolic
strides), it is assumed to be a kernel whose result may also share its input's memory.
:func:`is_kernel` is the question multi-stream scheduling, its checker and its cost model ask.

>>> node_memory(reshape_of_expand)                 # doctest: +SKIP
NodeMemory(kind='copy', shares=(), fresh=True)

:class:`AliasInfo` is a snapshot of the graph (by the schemas: what *may* alias): rebuild it
after changing the graph, or tell it what changed — :meth:`AliasInfo.forget` a node that
went, :meth:`AliasInfo.replace` a value whose uses now read another (the analysis manager
does this for each change made through the editor, see :mod:`fxpass.core.analyses`).
"""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

from ..fxutil.dialect import aten_op
from ..fxutil.fx_internals import is_erased
from ..fxutil.ops import schema_of
from ..fxutil.values import node_val
from ..fxutil.views import always_view, returns_view, shares_storage
from ..ops.stream import is_stream_op

__all__ = [
    "FUNCTIONAL_HOPS",
    "AliasInfo",
    "NodeMemory",
    "aliased_args",
    "hop_name",
    "is_kernel",
    "lay_out_args",
    "node_memory",
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
        return schema_of(node.target)
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
        for i, a in enumerate(schema_of(op).arguments)
        if a.alias_info is not None and a.alias_info.is_write
    )


@functools.cache
def _alias_slots(op: torch._ops.OpOverload) -> _Slots:
    """The arguments of ``op`` whose memory its results may share, cached per op."""
    schema = schema_of(op)
    sets = set()
    for ret in schema.returns:
        if ret.alias_info is not None:
            sets |= set(ret.alias_info.after_set) | set(ret.alias_info.before_set)
    # ``Tensor(a -> *) self ... -> Tensor(a)[]`` (split, unbind): the list's elements alias
    # ``self``; torch's Python binding shows the list's own (empty) alias sets, and the
    # argument's flow into the wildcard set
    return tuple(
        (i, a.name, a.kwarg_only)
        for i, a in enumerate(schema.arguments)
        if a.alias_info is not None
        and (
            (sets and sets & set(a.alias_info.before_set))
            or (not a.alias_info.is_write and "*" in a.alias_info.after_set)
        )
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


# ----- what a node actually does, decided from values ----------------------------------------
_aten = torch.ops.aten
_HOST_OPS = frozenset(  # sizes and metadata checks: the host answers, no kernel runs
    {
        _aten.sym_size.int,
        _aten.sym_stride.int,
        _aten.sym_numel.default,
        _aten.sym_storage_offset.default,
        _aten._assert_tensor_metadata.default,
        _aten._assert_scalar.default,
    }
)
_KERNELS = frozenset({"copy", "kernel", "in_place", "unknown"})


@dataclass(frozen=True)
class NodeMemory:
    """What one node does with memory.

    ``kind``: ``"view"`` (its result is (part of) an input's memory; no kernel runs),
    ``"copy"`` (an op that may alias copies for this layout), ``"kernel"`` (fresh memory),
    ``"in_place"`` (writes an input), ``"unknown"`` (a kernel whose result may also share its
    input's memory), ``"none"`` (inputs, outputs, stream ops, ``getitem``, sizes and
    checks: no kernel). ``shares``: the inputs whose memory the result shares. ``fresh``:
    whether the result has memory of its own, written by this node's kernel.
    """

    kind: str
    shares: tuple[fx.Node, ...] = ()
    fresh: bool = False

    @property
    def kernel(self) -> bool:
        """Does the node launch work on the current stream?"""
        return self.kind in _KERNELS


_NONE = NodeMemory("none")


def _tensorish(val: Any) -> bool:
    if val is None:
        return True  # unknown: assume the worst
    if isinstance(val, torch.Tensor):
        return True
    if isinstance(val, (list, tuple)):
        return any(isinstance(v, torch.Tensor) for v in val)
    return False


def _shares_with(node: fx.Node, inputs: list[fx.Node]) -> list[fx.Node]:
    """The ``inputs`` whose traced value shares storage with ``node``'s (fake tensors keep
    aliasing); empty where there are no values."""
    val = node_val(node)
    outs = val if isinstance(val, (list, tuple)) else [val]
    outs = [o for o in outs if isinstance(o, torch.Tensor)]
    return [i for i in inputs if any(shares_storage(o, node_val(i)) for o in outs)]


def _example(value: Any) -> Any:
    """A node's example value in an argument (the node itself where it has none)."""
    return fx.node.map_arg(value, lambda n: n if node_val(n) is None else node_val(n))


def node_memory(node: fx.Node) -> NodeMemory:
    """What ``node`` does with memory (see :class:`NodeMemory`), decided from values: its
    traced value sharing an input's storage, torch's kernels on meta tensors of its inputs'
    layouts, the op's schema; where none of them can tell, a kernel that may alias."""
    if node.op not in ("call_function", "call_method", "call_module"):
        return _NONE
    if is_stream_op(node) or node.target is operator.getitem or node.target in _HOST_OPS:
        return _NONE
    inputs = node.all_input_nodes
    if not _tensorish(node_val(node)) and not any(_tensorish(node_val(i)) for i in inputs):
        return _NONE  # arithmetic on sizes
    schema = op_schema(node)
    may = aliased_args(node)
    if written_args(node):
        return NodeMemory("in_place", tuple(may), fresh=schema is None)
    opaque = node.op == "call_module" or hop_name(node) is not None
    if not may:
        shared = _shares_with(node, inputs) if schema is not None else []
        return NodeMemory("view", tuple(shared)) if shared else NodeMemory("kernel", fresh=True)
    if opaque:
        return NodeMemory("unknown", tuple(may), fresh=True)
    if _shares_with(node, may):
        return NodeMemory("view", tuple(may))
    if schema is not None:
        op = aten_op(node.target)
        view = (
            True
            if always_view(op)
            else returns_view(op, _example(node.args), _example(node.kwargs))
        )
        if view is not None:
            return NodeMemory("view", tuple(may)) if view else NodeMemory("copy", fresh=True)
    return NodeMemory("unknown", tuple(may), fresh=True)


def is_kernel(node: fx.Node) -> bool:
    """Does ``node`` launch work on the current stream? Not: inputs, outputs, stream ops,
    ``getitem``, sizes and metadata checks, and views — decided from values, so a
    ``reshape`` that copies (of an ``expand``, a transpose) *is* a kernel."""
    return node_memory(node).kernel


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
