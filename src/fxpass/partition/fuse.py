"""Fusing partitions: each partition becomes one submodule call, and can be un-fused again.

:func:`fuse_partitions` moves the nodes of each partition into a new ``GraphModule`` and calls
it from the graph, in one of two ways:

* ``mode="module"``: a ``call_module`` node (torch's ``fuse_by_partitions``);
* ``mode="delegate"``: for IRs that forbid ``call_module`` (export, ExecuTorch's edge
  dialect), a ``get_attr`` of the submodule and a ``call_function`` of a delegate — by
  default ``torch.ops.higher_order.invoke_subgraph(subgraph, name, *inputs)``, or any
  function ``delegate(subgraph, *inputs)`` you give (:func:`call_delegate` just runs it).

Before (``add`` and ``mul`` in one partition)::

    %x : placeholder ; %w : placeholder
    %mm  = aten.mm(%x, %w)
    %add = aten.add.Tensor(%mm, %x)
    %mul = aten.mul.Tensor(%add, %w)
    return (%mul,)

After ``fuse_partitions(gm, parts)``::

    %x : placeholder ; %w : placeholder
    %mm = aten.mm(%x, %w)
    %fused_0 = call_module[fused_0](%x, %w, %mm)     # inputs in graph order
    return (%fused_0,)

Unlike torch's, the submodule's inputs keep the order of the graph (placeholders first, in
their order) rather than the order of first use, and metadata is kept: the nodes inside keep
theirs, the call carries ``val`` (a tuple for several outputs), ``stack_trace``, the common
``nn_module_stack`` and ``fxpass_partition`` (what was fused), and each output ``getitem``
takes the metadata of the node it replaces. :func:`unfuse` puts the nodes back.
"""

from __future__ import annotations

import copy
import heapq
import operator
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal

import torch
from torch import fx

from ..core.errors import FxpassError
from ..edit.editor import Editor
from ..fxutil.fx_internals import graph_end, is_erased, sort_key
from .base import Partition, find_cycle

__all__ = [
    "FUSED_META",
    "PartitionCycleError",
    "call_delegate",
    "fuse_partitions",
    "fused_nodes",
    "unfuse",
]

#: ``node.meta`` key on every call :func:`fuse_partitions` creates.
FUSED_META = "fxpass_partition"
_RULE = "partition"


class PartitionCycleError(FxpassError, ValueError):
    """Fusing these partitions would create a dependency cycle."""


def call_delegate(subgraph: torch.nn.Module, *inputs: Any) -> Any:
    """The simplest delegate: run the fused subgraph (a stand-in for a backend's call)."""
    return subgraph(*inputs)


_INVOKE_SUBGRAPH: Any = None


def _invoke_subgraph() -> Any:
    global _INVOKE_SUBGRAPH
    if _INVOKE_SUBGRAPH is None:
        from torch._higher_order_ops.invoke_subgraph import invoke_subgraph

        _INVOKE_SUBGRAPH = invoke_subgraph
    return _INVOKE_SUBGRAPH


def fuse_partitions(
    gm: fx.GraphModule,
    partitions: Sequence[Partition | Iterable[fx.Node]],
    *,
    prefix: str = "fused_",
    mode: Literal["module", "delegate"] = "module",
    delegate: Callable[..., Any] | None = None,
    input_order: Literal["graph", "first_use"] = "graph",
    always_return_tuple: bool = False,
    recompile: bool = True,
    editor: Editor | None = None,
) -> fx.GraphModule:
    """Replace each partition of ``gm`` by one call of a new submodule ``{prefix}{i}``.

    ``partitions`` are :class:`Partition` objects or iterables of nodes; together they must
    leave the graph acyclic (:class:`PartitionCycleError` says which ones do not). Returns
    ``gm``, changed in place (its code regenerated unless ``recompile=False``).
    The calls it makes are :func:`fused_nodes` (with ``meta["fxpass_partition"]``).
    ``editor``: what the fusions go through (a pass's ``ctx.editor``; default: the run in
    progress's, ``Editor.current()``).
    """
    if mode not in ("module", "delegate"):
        raise ValueError(f"fuse_partitions: mode must be 'module' or 'delegate', not {mode!r}")
    if input_order not in ("graph", "first_use"):
        raise ValueError(
            f"fuse_partitions: input_order must be 'graph' or 'first_use', not {input_order!r}"
        )
    groups = [list(getattr(p, "nodes", p)) for p in partitions]
    _check(gm, groups)
    names = _free_names(gm, prefix, len(groups))
    if mode == "delegate" and delegate is None:
        delegate = _invoke_subgraph()
    out_of_order = False
    editor = editor if editor is not None else Editor.current()
    for index, nodes in enumerate(groups):
        # each fusion is one change a debug counter may veto (a subset of cycle-free
        # partitions is cycle-free too)
        if not nodes or not editor.allow():
            continue
        nodes = sorted(nodes, key=sort_key)  # graph order (torch keeps the keys up to date)
        fused = _Fusion(gm, nodes, names[index], input_order, editor)
        fused.build(mode == "delegate" or always_return_tuple)
        out_of_order |= fused.insert(mode, delegate, index)
    if out_of_order:
        _stable_toposort(gm.graph, editor)
    gm.graph.lint()
    if recompile:
        gm.recompile()
    return gm


def _check(gm: fx.GraphModule, groups: list[list[fx.Node]]) -> None:
    for i, nodes in enumerate(groups):
        for node in nodes:
            if node.graph is not gm.graph or is_erased(node):
                raise ValueError(
                    f"partition {i}: node {node.name} is not in this graph module's graph"
                )
            if node.op in ("placeholder", "output"):
                what = "a graph input" if node.op == "placeholder" else "the graph's output"
                raise ValueError(
                    f"partition {i}: node {node.name} is {what}; only nodes that compute "
                    "something can be fused (drop it from the partition)"
                )
    cycle = find_cycle(groups)
    if cycle is not None:
        raise PartitionCycleError(
            f"fusing partitions {cycle} would create a dependency cycle: a path leaves one of "
            "them and comes back into it through the others; split or drop one of them "
            "(fxpass.partition.capability_partitions proposes cycle-free partitions)"
        )


def _free_names(gm: fx.GraphModule, prefix: str, count: int) -> list[str]:
    taken = set(dict(gm.named_children())) | set(gm.__dict__)
    names, i = [], 0
    while len(names) < count:
        name = f"{prefix}{i}"
        if name not in taken and not hasattr(gm, name):
            names.append(name)
        i += 1
    return names


class _Fusion:
    """One partition being moved into a submodule."""

    def __init__(self, gm, nodes, name, input_order, editor: Editor) -> None:
        self.gm = gm
        self.editor = editor
        self.nodes = nodes
        self.members = Partition(nodes=nodes)  # in graph order
        self.name = name
        self.input_order = input_order

    def build(self, as_tuple: bool) -> None:
        """The submodule's graph: a new one, no run watches it yet."""
        sub = fx.Graph()
        editor = self.editor
        self.inputs = self.members.inputs
        if self.input_order == "graph":
            self.inputs.sort(key=sort_key)
        env: dict[fx.Node, fx.Node] = {}
        for x in self.inputs:
            ph = editor.create(sub, "placeholder", x.name, type_expr=x.type)
            ph.meta = copy.copy(x.meta)
            env[x] = ph
        for node in self.nodes:
            env[node] = editor.copy(node, env.__getitem__, into=sub)
        self.outputs = self.members.outputs
        results = tuple(env[n] for n in self.outputs)
        self.tuple_output = as_tuple or len(results) != 1
        editor.create(sub, "output", "output", (results if self.tuple_output else results[0],))
        sub.lint()
        self.module = fx.GraphModule(self.gm, sub, class_name=self.name)

    def insert(self, mode: str, delegate: Any, index: int) -> bool:
        """Call the submodule where the partition was (one change); True if a user of its
        results now comes before the call."""
        gm, nodes, editor = self.gm, self.nodes, self.editor
        gm.add_submodule(self.name, self.module)
        with editor.change("replace", _RULE, nodes):
            where = {"rule": _RULE, "origin": nodes, "before": nodes[-1].next, "inherit": False}
            if mode == "module":
                call = editor.insert(self.name, tuple(self.inputs), op="call_module", **where)
            else:
                attr = editor.insert(self.name, op="get_attr", **where)
                args = (attr, self.name) if delegate is _invoke_subgraph() else (attr,)
                call = editor.insert(delegate, (*args, *self.inputs), **where)
            self.call = call
            call.meta.update(self._call_meta(index))
            out_of_order = self._rewire(call)
            for node in reversed(nodes):
                editor.erase(node, _RULE)
        return out_of_order

    def _call_meta(self, index: int) -> dict[str, Any]:
        vals = [n.meta.get("val") for n in self.outputs]
        meta: dict[str, Any] = {
            FUSED_META: {
                "index": index,
                "name": self.name,
                "nodes": [n.name for n in self.nodes],
                "outputs": [n.name for n in self.outputs],
            }
        }
        if all(v is not None for v in vals):
            meta["val"] = tuple(vals) if self.tuple_output else vals[0]
        traces = list(dict.fromkeys(t for n in self.nodes if (t := n.meta.get("stack_trace"))))
        if traces:
            meta["stack_trace"] = "\n".join(traces)
        stack = _common_module_stack(self.nodes)
        if stack is not None:
            meta["nn_module_stack"] = stack
        return meta

    def _rewire(self, call: fx.Node) -> bool:
        """Point the outputs' users at the call; True if a user now precedes it."""
        editor = self.editor
        replacements: list[tuple[fx.Node, fx.Node]] = []
        if not self.tuple_output:
            replacements.append((self.outputs[0], call))
        else:
            anchor = call.next
            for i, orig in enumerate(self.outputs):
                getter = editor.insert(
                    operator.getitem, (call, i), rule=_RULE, origin=[orig], before=anchor
                )
                replacements.append((orig, getter))
        out_of_order = False
        for orig, new in replacements:
            for user in orig.users:
                if user not in self.members and sort_key(user) < sort_key(new):
                    out_of_order = True
            meta = dict(new.meta)
            if new is not call:  # it stands for ``orig``: its metadata, and its provenance
                meta = {k: meta[k] for k in ("from_node", "fxpass_provenance")}
            new.meta = {**orig.meta, **meta}
            editor.replace_all_uses(
                orig, new, _RULE, erase_old=False, only=lambda u: u not in self.members
            )
        return out_of_order


def _common_module_stack(nodes: Sequence[fx.Node]) -> dict | None:
    stacks = [n.meta.get("nn_module_stack") for n in nodes]
    if not stacks or any(s is None for s in stacks):
        return None
    common = list(stacks[0].items())
    for stack in stacks[1:]:
        items = list(stack.items())
        k = 0
        while k < min(len(common), len(items)) and common[k] == items[k]:
            k += 1
        common = common[:k]
    return dict(common)


def _stable_toposort(graph: fx.Graph, editor: Editor) -> None:
    """Reorder nodes topologically, keeping the current order wherever it is already valid
    (one change, the fusions' consequence: the debug counter allowed them)."""
    nodes = list(graph.nodes)
    index = {n: i for i, n in enumerate(nodes)}
    waiting = {n: len(n.all_input_nodes) for n in nodes}
    ready = [(i, n) for i, n in enumerate(nodes) if waiting[n] == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        _, node = heapq.heappop(ready)
        order.append(node)
        for user in node.users:
            waiting[user] -= 1
            if waiting[user] == 0:
                heapq.heappush(ready, (index[user], user))
    if len(order) != len(nodes):
        raise PartitionCycleError("the fused graph has a cycle")  # checked before; defensive
    cursor = graph_end(graph)
    with editor.change("modify", f"{_RULE}.order") as change:
        change.new = []
        for node in order:
            if cursor.next is not node:
                editor.move(node, after=cursor, rule=change.rule)
                change.new.append(node)
            cursor = node


def fused_nodes(gm: fx.GraphModule) -> list[fx.Node]:
    """The calls :func:`fuse_partitions` created in ``gm``, in graph order."""
    return [n for n in gm.graph.nodes if FUSED_META in n.meta]


def unfuse(
    gm: fx.GraphModule,
    names: Iterable[str] | None = None,
    *,
    recompile: bool = True,
    editor: Editor | None = None,
) -> int:
    """Inline fused submodules back into ``gm`` (all, or those named in ``names``).

    Nodes get their original names back where those are free, and keep their metadata.
    Returns how many calls were inlined. ``editor`` as for :func:`fuse_partitions`.
    """
    wanted = None if names is None else set(names)
    count = 0
    editor = editor if editor is not None else Editor.current()
    for call in fused_nodes(gm):
        name = call.meta[FUSED_META]["name"]
        if (wanted is not None and name not in wanted) or not editor.allow():
            continue
        with editor.change("replace", "unfuse", [call]) as change:
            change.new = _inline(gm, call, name, editor)
        count += 1
    if count:
        gm.graph.lint()
        if recompile:
            gm.recompile()
    return count


def _inline(gm: fx.GraphModule, call: fx.Node, name: str, editor: Editor) -> list[fx.Node]:
    """Put the nodes of the submodule ``call`` calls back in its place; returns them."""
    graph = gm.graph
    sub: fx.GraphModule = getattr(gm, name)
    if call.op == "call_module":
        inputs, attr = list(call.args), None
    else:
        attr = call.args[0]
        skip = 2 if call.target is _invoke_subgraph() else 1
        inputs = list(call.args[skip:])
    env: dict[fx.Node, Any] = {}
    placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
    env.update(zip(placeholders, inputs))
    copies = []
    with graph.inserting_before(call):
        for node in sub.graph.nodes:
            if node.op in ("placeholder", "output"):
                continue
            env[node] = editor.copy(node, env.__getitem__, into=graph)
            copies.append((env[node], node.name))
    result = fx.node.map_arg(sub.graph.output_node().args[0], env.__getitem__)
    for user in list(call.users):
        if isinstance(result, (tuple, list)) and user.target is operator.getitem:
            editor.replace_all_uses(user, result[user.args[1]], "unfuse")
    if call.users:
        editor.replace_all_uses(call, result, "unfuse", erase_old=False)
    editor.erase(call, "unfuse")
    if attr is not None and not attr.users:
        editor.erase(attr, "unfuse")
    delattr(gm, name)
    live = {n.name for n in graph.nodes}
    for node, original in copies:
        if node.name != original and original not in live:
            editor.rename(node, original, rule="unfuse")
            live.add(original)
    return [node for node, _ in copies]
