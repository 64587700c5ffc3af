"""Every private torch.fx internal fxpass touches, one function each.

torch.fx keeps state that its public API does not expose or exposes only at a cost
(``Node.args`` copies nothing but ``Node.__setattr__`` re-indexes, ``Graph.erase_node``
checks what fxpass already knows). fxpass reads and writes that state for speed and for
exact rollback; doing it only here means a torch upgrade that renames an internal breaks
one file, and the functions below say what each internal is for. Saving and restoring a
graph's state for exact rollback, which reads the same internals, is the concept of its own
beside this one: ``fx_state.py``.
"""

from __future__ import annotations

import contextlib
import copy
import operator
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import fx
from torch.fx._lazy_graph_module import (
    _LazyGraphModule,
    _make_graph_module,
    _use_lazy_graph_module,
)
from torch.fx.graph import _FindNodesLookupTable, _Namespace
from torch.fx.node import _get_qualified_name, map_arg

__all__ = [
    "ARGS_ATTR",
    "new_namespace",
    "KWARGS_ATTR",
    "bind_owner",
    "codegen_of",
    "copy_code_fields",
    "EXPORTED_META",
    "copy_sharing_specs",
    "dead_node_eraser",
    "default_node_name",
    "empty_graph_like",
    "graph_end",
    "lint_nodes",
    "graph_stamp",
    "graph_structure",
    "input_nodes",
    "is_erased",
    "is_exported_graph",
    "is_lazy_module",
    "last_node",
    "lazy_exported_programs",
    "make_lazy",
    "make_lazy_module",
    "module_tables",
    "node_args",
    "node_kwargs",
    "out_spec_of",
    "nodes_after",
    "nodes_between",
    "own_graph",
    "pytree_info",
    "qualified_name",
    "refill_graph",
    "relink_as_copied",
    "release_name",
    "rename_node",
    "set_args_kwargs",
    "set_pytree_info",
    "sort_key",
    "use_codegen",
    "use_plain_codegen",
]

_set = object.__setattr__

#: Whether a node was erased from its graph.
is_erased: Callable[[fx.Node], bool] = operator.attrgetter("_erased")
#: A node's position: torch keeps these keys ordered as the graph's list, through every edit.
sort_key: Callable[[fx.Node], Any] = operator.attrgetter("_sort_key")
#: A node's positional arguments, without the copy-free property's overhead.
node_args: Callable[[fx.Node], tuple] = operator.attrgetter("_args")
#: A node's keyword arguments, without the property's overhead.
node_kwargs: Callable[[fx.Node], dict] = operator.attrgetter("_kwargs")
#: The attribute names behind :data:`node_args` / :data:`node_kwargs`, for generated code
#: (an attribute read inline, without a call).
ARGS_ATTR, KWARGS_ATTR = "_args", "_kwargs"


def new_namespace() -> Any:
    """An empty ``torch.fx`` name namespace (``create_name(candidate, obj)`` gives unique
    Python names, as a graph names its nodes)."""
    return _Namespace()


def input_nodes(node: fx.Node) -> Any:
    """The nodes ``node`` reads, as torch's insertion-ordered dict (no list built)."""
    return node._input_nodes


def qualified_name(target: Any) -> str:
    """torch's ``module.name`` spelling of a call target (``torch.ops.aten.add.Tensor``)."""
    return _get_qualified_name(target)


def default_node_name(graph: fx.Graph, target: Any) -> str:
    """The name ``graph.create_node`` derives from ``target`` when given none, spelled as
    the graph's namespace spells a candidate (illegal characters replaced): given as the
    candidate it makes the same name, without the namespace's two regex rounds and
    substitution for a dotted one (``add.tensor``; every OpOverload's), ~4 us a node."""
    return _legal_candidate(graph._target_to_str(target))


def _legal_candidate(candidate: str) -> str:
    """What ``_Namespace.create_name`` turns ``candidate`` into before it numbers it."""
    if _NAME_REGEX is None or _NAME_REGEX.match(candidate) is not None:
        return candidate
    candidate = _ILLEGAL_CHARS.sub("_", candidate)
    if not candidate:
        candidate = "_unnamed"
    if candidate[0].isdigit():
        candidate = f"_{candidate}"
    return candidate


_NAME_REGEX = getattr(torch.fx.graph, "_name_regex", None)
_ILLEGAL_CHARS = getattr(torch.fx.graph, "_illegal_char_regex", None)
if _ILLEGAL_CHARS is None:
    _NAME_REGEX = None  # another torch: hand the candidate over as it is


def set_args_kwargs(node: fx.Node, args: tuple, kwargs: dict) -> None:
    """Set a node's arguments and users in one step (what the ``args`` setter does, minus
    its scan of every argument for raw symbolic values)."""
    node._update_args_kwargs(args, kwargs)


def rename_node(node: fx.Node, name: str) -> None:
    """Give ``node`` the name ``name`` (or the graph's next free spelling of it)."""
    node._rename(name)


def release_name(graph: fx.Graph, name: str) -> None:
    """Let a node of ``graph`` take ``name`` again: erased nodes keep their names reserved
    in the graph's namespace; this releases one (best effort)."""
    namespace = getattr(graph, "_graph_namespace", None)
    used = getattr(namespace, "_used_names", None)
    if isinstance(used, set):
        used.discard(name)


def refill_graph(graph: fx.Graph, source: fx.Graph) -> None:
    """Make ``graph`` (the same object) hold copies of ``source``'s nodes, with their names
    and metadata, in place of its own: a restore (of a cached result), not a pass's edit."""
    for node in reversed(list(graph.nodes)):  # users go before the nodes they read
        graph.erase_node(node)
        release_name(graph, node.name)  # the copies take their names back
    value_map: dict[fx.Node, fx.Node] = {}
    out = graph.graph_copy(source, value_map, return_output_node=True)
    if out is not None:
        value, old_output = out
        graph.output(value).meta.update(old_output.meta)


def graph_end(graph: fx.Graph) -> fx.Node:
    """The sentinel before the first and after the last node (``cursor.append`` from it
    puts a node first)."""
    return graph._root


def last_node(graph: fx.Graph) -> fx.Node:
    """The graph's last node, or its end sentinel when it has none (a mark for
    :func:`nodes_after`)."""
    return graph._root._prev


def nodes_after(graph: fx.Graph, mark: fx.Node) -> list[fx.Node]:
    """The nodes after ``mark`` to the end of the graph."""
    out, n, end = [], mark._next, graph._root
    while n is not end:
        out.append(n)
        n = n._next
    return out


def nodes_between(before: fx.Node, anchor: fx.Node) -> list[fx.Node]:
    """The nodes strictly between ``before`` and ``anchor`` (which comes after it)."""
    out, n = [], before._next
    while n is not anchor:
        out.append(n)
        n = n._next
    return out


#: ``gm.meta`` key the ExportedProgram target sets on the graph module passes run on: an
#: exported program's IR has no ``call_module``, so a pass that makes submodules must call
#: them another way (``partition`` then uses ``invoke_subgraph``).
EXPORTED_META = "fxpass_exported_program"


def is_exported_graph(gm: fx.GraphModule) -> bool:
    """Whether the passes run on the graph of an ExportedProgram (see :data:`EXPORTED_META`)."""
    return bool(gm.meta.get(EXPORTED_META))


def copy_sharing_specs(obj: Any) -> Any:
    """``copy.deepcopy(obj)``, sharing torch's pytree leaf spec instead of copying it.

    Pytree specs are immutable; copying the leaf spec calls the deprecated ``LeafSpec``
    constructor (torch >= 2.10 warns ``isinstance(treespec, LeafSpec)`` is deprecated, an
    error under ``-W error::FutureWarning``). Graphs of exported programs hold specs in their
    code generator and module call graph."""
    from torch.utils import _pytree as pytree

    leaf = pytree.treespec_leaf()
    return copy.deepcopy(obj, {id(leaf): leaf})


def empty_graph_like(graph: fx.Graph) -> fx.Graph:
    """An empty graph with ``graph``'s tracer class and code generator (which holds e.g.
    the pytree flattening of an ``ExportedProgram.module()``'s inputs and outputs)."""
    new = fx.Graph(tracer_cls=graph._tracer_cls)
    new._codegen = copy_sharing_specs(graph._codegen)
    return new


def use_codegen(source: fx.Graph, target: fx.Graph, *, copy_it: bool = False) -> None:
    """Give ``target`` ``source``'s code generator (its own copy with ``copy_it``): the
    pytree flattening of inputs and outputs an ``ExportedProgram.module()`` has."""
    target._codegen = copy_sharing_specs(source._codegen) if copy_it else source._codegen


def codegen_of(graph: fx.Graph) -> Any:
    """``graph``'s code generator (an ExportedProgram module's holds its pytree specs)."""
    return graph._codegen


def pytree_info(graph: fx.Graph) -> Any:
    """The pytree flattening of ``graph``'s inputs and outputs, or None where it has none."""
    codegen = graph._codegen
    return codegen.pytree_info if isinstance(codegen, fx.graph._PyTreeCodeGen) else None


def set_pytree_info(graph: fx.Graph, orig_args: Any, in_spec: Any, out_spec: Any) -> None:
    """Flatten ``graph``'s inputs and outputs by these specs (what ``ep.module()`` does)."""
    graph._codegen = fx.graph._PyTreeCodeGen(fx.graph._PyTreeInfo(orig_args, in_spec, out_spec))


def use_plain_codegen(graph: fx.Graph) -> None:
    """Give ``graph`` torch's plain code generator: no pytree specs of inputs and outputs."""
    graph._codegen = fx.graph.CodeGen()


def out_spec_of(gm: fx.GraphModule) -> Any:
    """The pytree spec a GraphModule's outputs are put back into (None where it has none)."""
    return gm._out_spec


def module_tables(module: torch.nn.Module) -> tuple[dict, dict, dict, set]:
    """A module's own tables, live: submodules, parameters, buffers (name -> value) and the
    names of its non-persistent buffers."""
    return module._modules, module._parameters, module._buffers, module._non_persistent_buffers_set


def is_lazy_module(gm: Any) -> bool:
    """Whether ``gm`` is torch's lazily compiled GraphModule (its code made when first run)."""
    return isinstance(gm, _LazyGraphModule)


def make_lazy_module(root: Any, graph: fx.Graph) -> fx.GraphModule:
    """A GraphModule of ``graph`` whose code is generated when first run (as Dynamo's)."""
    with _use_lazy_graph_module(True):
        return _make_graph_module(root, graph)


def make_lazy(gm: fx.GraphModule) -> fx.GraphModule:
    """Make ``gm``'s code lazy, in place: it is generated when the module is next called,
    printed, pickled or its ``code`` read (torch's ``_LazyGraphModule``, which a plain
    GraphModule becomes by taking a class of its own that derives from both). Returns ``gm``.
    """
    if not isinstance(gm, _LazyGraphModule):
        # torch gives every GraphModule a class of its own (named GraphModuleImpl) derived
        # from the class it was made as; recompile() stores the code on it. The new one
        # derives from that class too, so methods of a GraphModule subclass stay.
        own = type(gm)
        made_as = next(c for c in own.__mro__ if c.__qualname__.split(".")[-1] != _IMPL)
        lazy = type(own.__name__, (_LazyGraphModule, made_as), {"__qualname__": _IMPL})
        gm.__class__ = lazy
    type(gm).recompile()  # _LazyGraphModule's recompile only marks the code stale
    return gm


_IMPL = "GraphModuleImpl"  # the name GraphModule.__new__ gives each module's own class


@contextlib.contextmanager
def lazy_exported_programs() -> Iterator[None]:
    """Inside the block, ``ExportedProgram(...)`` gives the program a lazy graph module
    (torch's constructor builds an eager ``GraphModule`` and so generates its code).

    The constructor calls ``torch.export.exported_program._create_graph_module_for_export``;
    the block swaps it for one that makes a ``_LazyGraphModule`` of the same root and
    graph. A program another thread builds meanwhile gets a lazy module too, which only
    means its code is generated on first use.
    """
    from torch.export import exported_program

    eager = exported_program._create_graph_module_for_export

    def create(root: Any, graph: fx.Graph) -> fx.GraphModule:
        return make_lazy_module(root, graph)

    exported_program._create_graph_module_for_export = create
    try:
        yield
    finally:
        exported_program._create_graph_module_for_export = eager


def copy_code_fields(source: fx.Graph, target: fx.Graph) -> None:
    """Give ``target`` the extra globals ``source``'s generated code refers to."""
    target._co_fields = dict(getattr(source, "_co_fields", {}))


def own_graph(module: Any) -> fx.Graph | None:
    """A GraphModule's graph as stored, without the ``graph`` property (None if it has none)."""
    return module.__dict__.get("_graph")


def bind_owner(gm: fx.GraphModule) -> None:
    """Make ``gm`` its graph's owning module again (after the graph's state was restored)."""
    gm.__dict__["_graph"]._owning_module = gm


def graph_stamp(graph: fx.Graph) -> tuple[int, int]:
    """A constant-time stamp that changes when a node is inserted or erased: the node
    count and the number of names the graph ever handed out (each new node takes one).
    Rewiring arguments does not change it (the fingerprint of ``core.snapshot`` sees that)."""
    return graph._len, len(graph._graph_namespace._used_names)


def graph_structure(graph: fx.Graph) -> list[tuple]:
    """Every node with its name, op, target and argument objects, for cheap comparison."""
    return [(n, n.name, n.op, n.target, n._args, n._kwargs) for n in graph.nodes]


def relink_as_copied(graph: fx.Graph, order: list[fx.Node]) -> bool:
    """Put all of ``graph``'s nodes in ``order`` and leave the graph as copying them node by
    node into a new ``fx.Graph()`` in that order (``Graph.node_copy``) would have made it:
    each node's users in creation order, a namespace and a ``find_nodes`` table filled in
    that order, a new graph's tracer and code fields. The nodes stay the same objects.

    False, with nothing changed, when a copy would have renamed a node.
    """
    namespace, table = _Namespace(), _FindNodesLookupTable()
    for n in order:
        if namespace.create_name(n.name, None) != n.name:
            return False
        namespace.associate_name_with_obj(n.name, n)
        table.insert(n)
    prev = None
    for n in order:  # the list: each node right after the one before it
        if prev is None:
            first = graph._root._next
            if first is not n:
                first.prepend(n)
        elif prev._next is not n:
            prev.append(n)
        prev = n
    for n in order:  # users: a copy adds each user when it creates it
        n.users.clear()
    for n in order:
        for used in n._input_nodes:
            used.users[n] = None
    graph._graph_namespace = namespace
    graph._find_nodes_lookup_table = table
    graph._used_names = {}
    graph._tracer_cls = None
    graph._tracer_extras = None
    graph._co_fields = {}
    return True


def _none(_: fx.Node) -> None:
    return None


def dead_node_eraser(graph: fx.Graph) -> Callable[[fx.Node], None] | None:
    """``graph.erase_node`` without its per-call overhead, for nodes known to be dead.

    It does what ``erase_node`` does (hooks, lookup table, list, argument users) but marks
    the node erased without ``Node.__setattr__``'s lookup-table round trip. None when this
    torch's graph internals look different (then use ``erase_node``).
    """
    table = getattr(getattr(graph, "_find_nodes_lookup_table", None), "table", None)
    if table is None or not hasattr(graph, "_len"):
        return None
    owner = graph.owning_module
    hooks = getattr(owner, "_erase_node_hooks", None) if owner is not None else None

    def erase(n: fx.Node) -> None:
        if hooks:
            for f in hooks:
                f(n)
        table[(n.op, n.target if n.op == "call_function" else None)].pop(n)
        n._remove_from_list()
        _set(n, "_erased", True)
        graph._len -= 1
        kwargs = n._kwargs
        n._update_args_kwargs(map_arg(n._args, _none), map_arg(kwargs, _none) if kwargs else {})

    return erase


def lint_nodes(graph: fx.Graph, nodes: Iterator[fx.Node]) -> None:
    """``graph.lint()`` over ``nodes`` (alive ones) only: opcode, owner, lookup table,
    links, arguments of this graph defined before the node and users after it, users
    agreeing with arguments, names as the namespace has them, targets present in the owning
    module."""
    from torch.fx.graph import _legal_ops

    # the lookup table's dict of dicts read with .get: its ``in`` is two Python calls and
    # adds an empty entry for a key it has not seen
    table, root = graph._find_nodes_lookup_table.table, graph._root
    names = graph._graph_namespace._obj_to_name
    owner = graph.owning_module
    legal = frozenset(_legal_ops)
    for n in nodes:
        if n is root or n._erased:
            continue
        op = n.op
        if op not in legal:
            raise RuntimeError(f"Node {n} had unknown opcode {n.op}!")
        if n.graph is not graph:
            raise RuntimeError(f"Node '{n}' does not belong to this Graph!")
        if n not in table.get((op, n.target if op == "call_function" else None), ()):
            raise RuntimeError(f"Node '{n}' is not added to the side table")
        if n._prev._next is not n or n._next._prev is not n:
            raise RuntimeError(f"Node '{n}' is not linked into the graph's list")
        if names.get(n, n.name) != n.name:
            raise RuntimeError(f"Node {n} is named {n.name!r} outside the graph's namespace")
        for arg in n._input_nodes:
            if arg.graph is not graph or arg._erased:
                raise RuntimeError(
                    f"Argument '{arg}' of Node '{n}' does not belong to this Graph, but was "
                    "used as an argument"
                )
            if arg._sort_key >= n._sort_key:
                raise RuntimeError(
                    f"Argument '{arg}' of Node '{n}' was used before it has been defined! "
                    "Please check that Nodes in the graph are topologically ordered"
                )
            if n not in arg.users:
                raise RuntimeError(f"Node '{n}' reads '{arg}' but is not among its users")
        for user in n.users:
            if n not in user._input_nodes or user._erased:
                raise RuntimeError(f"'{user}' is a user of Node '{n}' but does not read it")
            if user._sort_key <= n._sort_key:
                raise RuntimeError(
                    f"Argument '{n}' of Node '{user}' was used before it has been defined! "
                    "Please check that Nodes in the graph are topologically ordered"
                )
        if owner is not None:
            if n.op == "call_function" and not callable(n.target):
                raise ValueError(f"Node {n} target {n.target} is not callable")
            if n.op in ("get_attr", "call_module"):
                m = owner
                for atom in n.target.split("."):
                    m = getattr(m, atom, None)
                    if m is None:
                        raise RuntimeError(
                            f"Node {n} target {n.target} references a nonexistent attribute"
                        )
