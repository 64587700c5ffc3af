"""Interpreter passes: rebuild a graph node by node, rewriting ops as you go (ExecuTorch Level 1).

Subclass :class:`InterpreterPass` and override :meth:`~InterpreterPass.call_operator`. The
pass walks the graph in order and calls it for every operator with the *new* values of its
arguments (:class:`ProxyValue` objects: a node of the graph being built plus its fake
tensor). Whatever it returns stands for the old node from then on:

* **one-to-one** — return ``super().call_operator(other_op, args, kwargs, meta)``;
* **one-to-X** — call ``super().call_operator`` several times, feeding one result into the
  next, and return the last;
* **one-to-none** — return one of the arguments (``args[0]``): the op disappears.

Before::

    %relu_ = call_function[target=aten.relu_.default](args = (%x,))

After ``ReplaceInplaceRelu`` (``relu_`` -> ``relu``)::

    %relu = call_function[target=aten.relu.default](args = (%x,))

Every node the pass creates gets ``meta["val"]`` (the op run on fake tensors),
``stack_trace``, ``nn_module_stack`` and the rest of the replaced node's metadata, plus
``from_node`` and ``fxpass_provenance`` naming the pass. Nodes the pass only copies keep
their metadata as it was and are not re-run. "Modified" is honest: when every node came
out as a copy of itself, the pass reports no change and hands back the module untouched
(ExecuTorch's ``ExportPass`` always says it changed the graph).

A real tensor among the arguments (``torch.tensor(2.0)``) becomes a constant of the new
module (a ``get_attr``; lifted to a program constant when the pass runs on an
ExportedProgram through :func:`fxpass.apply`).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import fx
from torch.utils import _pytree as pytree

from .core.context import PassContext, current_context
from .core.contract import Pass, PassResult
from .edit.editor import Editor
from .edit.location import source_location
from .edit.provenance import COPIED_META
from .fxutil.fx_internals import (
    copy_code_fields,
    empty_graph_like,
    is_erased,
    last_node,
    nodes_after,
)
from .fxutil.ops import schema_of
from .fxutil.paths import get_path
from .fxutil.values import FakeEvaluator, returns_alias, same_value

__all__ = ["ExportPass", "InterpreterPass", "ProxyValue", "map_args"]

# Metadata a rewritten node inherits from the node it replaces (``val`` is recomputed).
_INHERITED = (*COPIED_META, "custom", "seq_nr", "original_aten", "from_node")


class ProxyValue:
    """A value of the graph being built: ``node`` (an ``fx.Node``) and ``data`` (its fake
    tensor, SymInt, tuple of those, or None). ExecuTorch's ``ProxyValue``."""

    __slots__ = ("_copy", "_exact", "data", "node")

    def __init__(
        self, node: fx.Node, data: Any, *, copy: bool = False, exact: bool = False
    ) -> None:
        self.node = node
        self.data = data
        self._copy = copy or exact  # the old node again: same op on the new values of its inputs
        self._exact = exact  # ... and those inputs are unchanged: ``data`` is its meta["val"]

    @property
    def meta(self) -> dict[str, Any]:
        return self.node.meta

    def to_tensor(self) -> torch.Tensor:
        """The (fake) tensor this value stands for."""
        if not isinstance(self.data, torch.Tensor):
            raise TypeError(f"{self.node.name} is not a tensor but {type(self.data).__name__}")
        return self.data

    def is_tensor(self) -> bool:
        return isinstance(self.data, torch.Tensor)

    def __repr__(self) -> str:
        return f"ProxyValue({self.node.name})"


def map_args(
    op: Any, fn: Callable[[Any, Any], Any], args: Sequence[Any], kwargs: Mapping[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Apply ``fn(value, schema_argument)`` to every argument of an ATen op call.

    ``schema_argument`` is the ``torch._C.Argument`` of the op's schema (``.name``,
    ``.type``, ``.kwarg_only``), so a pass can act on arguments by their declared type —
    the seed's ``args_map``. Ops without a schema are returned unchanged.
    """
    args, kwargs = list(args), dict(kwargs)
    schema = schema_of(op)
    if schema is None:
        return tuple(args), kwargs
    for i, arg in enumerate(schema.arguments):
        if arg.name in kwargs:
            kwargs[arg.name] = fn(kwargs[arg.name], arg)
        elif not arg.kwarg_only and i < len(args):
            args[i] = fn(args[i], arg)
    return tuple(args), kwargs


def _value_kept(new: Any, old: fx.Node) -> bool:
    """Whether ``new`` (the new value of input ``old``) has ``old``'s metadata. An attribute
    (a raw tensor or module in the environment) runs as it is."""
    if isinstance(new, ProxyValue):
        return same_value(new.data, old.meta.get("val"))
    if isinstance(new, torch.Tensor):
        return same_value(new, old.meta.get("val"))
    return True


class InterpreterPass(Pass):
    """Base class of interpreter passes; override :meth:`call_operator` (and the other hooks).

    >>> class ReplaceAddWithMulSub(InterpreterPass):
    ...     def call_operator(self, op, args, kwargs, meta):
    ...         if op is not torch.ops.aten.add.Tensor:
    ...             return super().call_operator(op, args, kwargs, meta)
    ...         x, y = args
    ...         mul = super().call_operator(torch.ops.aten.mul.Tensor, (x, y), {}, meta)
    ...         return super().call_operator(torch.ops.aten.sub.Tensor, (mul, y), {}, meta)
    >>> result = ReplaceAddWithMulSub()(gm)          # doctest: +SKIP

    The graph must carry fake values (``meta["val"]`` on placeholders, as graphs from
    ``torch.export``, AOTAutograd and Dynamo do) or the run must have ``sample_inputs``.
    """

    statistics = {"rewritten": "nodes the pass replaced by something other than a copy"}

    # ----- hooks to override ---------------------------------------------------------------
    def call_operator(
        self, op: Any, args: tuple[Any, ...], kwargs: dict[str, Any], meta: dict[str, Any]
    ) -> ProxyValue:
        """Emit ``op(*args, **kwargs)`` into the new graph and return its value.

        ``meta`` is the metadata of the node being rewritten; the new node inherits its
        stack trace and module stack. ``args`` may hold :class:`ProxyValue` objects,
        Python scalars and real tensors (which become constants).
        """
        return self._emit(op, args, kwargs, meta)

    def call_getitem(self, value: ProxyValue, key: int, meta: dict[str, Any]) -> ProxyValue:
        """Emit ``value[key]`` (an element of a multi-output op)."""
        return self._emit(operator.getitem, (value, key), {}, meta)

    def placeholder(self, name: str, arg: Any, meta: dict[str, Any]) -> ProxyValue:
        """Emit a graph input named ``name`` whose fake value is ``arg``."""
        node = self._build.create(self._graph, "placeholder", name)
        node.meta.update(meta)
        node.meta["val"] = arg
        return ProxyValue(node, arg, exact=self._current is not None and name == self._current.name)

    def output(self, results: list[Any], meta: dict[str, Any]) -> Any:
        """Emit the graph's output."""
        old = self._current
        structure = pytree.tree_map(
            lambda v: v.node if isinstance(v, ProxyValue) else self._lift(v), results
        )
        node = self._build.create(
            self._graph, "output", "output", (structure,), type_expr=getattr(old, "type", None)
        )
        node.meta.update(meta)
        return node

    # ----- running -------------------------------------------------------------------------
    def call(self, gm: fx.GraphModule, ctx: PassContext | None = None) -> PassResult:
        """Interpret ``gm`` into a new graph; ``ctx``: the run's context (None, as from a
        subclass's ``call(gm)`` that did not ask for it: the run in progress, if any)."""
        self._setup(gm, ctx)
        try:
            for node in gm.graph.nodes:
                self._visit(node)
            if not self._changed:
                return PassResult(gm, False)
            return PassResult(self._finish(gm), True, {"rewritten": self._rewrites})
        finally:
            self._teardown()

    def _setup(self, gm: fx.GraphModule, ctx: PassContext | None) -> None:
        self._gm = gm
        self._graph = empty_graph_like(gm.graph)
        self._env: dict[fx.Node, Any] = {}
        self._constants: dict[str, torch.Tensor] = {}
        self._changed = False
        self._rewrites = 0
        self._where: str | None = None  # the location provenance names (see _mark_provenance)
        self._current: fx.Node | None = None
        self._val_taken = False  # the current node's fake value went to a new node already
        self._inputs_seen = 0
        self._last_constant: fx.Node | None = None
        self._mode = self._find_fake_mode(gm)
        self._fake = FakeEvaluator(self._mode, owner=type(self).__name__)
        if ctx is None:
            ctx = current_context()
        # asks the run, tells it what was rewritten
        self._editor = ctx.editor.naming(self.name) if ctx is not None else Editor(None, self.name)
        # builds the new graph, which no run watches until it replaces the old one
        self._build = Editor(None, self.name)
        inputs = ctx.sample_inputs if ctx is not None else None
        self._sample = list(inputs) if inputs is not None else None

    def _teardown(self) -> None:
        for attr in (
            "_gm",
            "_graph",
            "_env",
            "_constants",
            "_editor",
            "_build",
            "_fake",
            "_sample",
            "_current",
            "_last_constant",
        ):
            self.__dict__.pop(attr, None)

    @staticmethod
    def _find_fake_mode(gm: fx.GraphModule) -> Any:
        from torch._guards import detect_fake_mode
        from torch._subclasses.fake_tensor import FakeTensorMode

        vals = [n.meta["val"] for n in gm.graph.nodes if "val" in n.meta]
        return detect_fake_mode(vals) or FakeTensorMode(allow_non_fake_inputs=True)

    def _visit(self, node: fx.Node) -> None:
        self._current = node
        if node.op == "placeholder":
            value = self._input_value(node, self._inputs_seen)
            self._inputs_seen += 1
            self._env[node] = proxy = self.placeholder(node.name, value, node.meta)
            # an overridden hook may give something other than the input, unchanged
            self._changed |= not getattr(proxy, "_exact", False)
        elif node.op == "output":
            results = fx.node.map_arg(node.args[0], self._env.__getitem__)
            self.output(results, node.meta)
        elif node.op == "get_attr":
            new = self._build.create(self._graph, "get_attr", node.target)
            new.meta.update(node.meta)
            self._env[node] = ProxyValue(new, node.meta.get("val"), exact=True)
        else:
            self.rewrite_node(node)

    def _input_value(self, node: fx.Node, index: int) -> Any:
        if "val" in node.meta:
            return node.meta["val"]
        if self._sample is not None and index < len(self._sample):
            value = self._sample[index]
            if isinstance(value, torch.Tensor):
                return self._mode.from_tensor(value, static_shapes=True)
            return value
        raise ValueError(
            f"{type(self).__name__}: input '{node.name}' has no meta['val'] and the run has no "
            "sample_inputs; capture the graph with torch.export / AOTAutograd / Dynamo, or "
            "pass sample_inputs (one per placeholder)"
        )

    def rewrite_node(self, node: fx.Node) -> None:
        """Run the hooks on one ``call_function`` node into the new graph (for a subclass
        that walks the graph itself, as ExecuTorch's ``ExportPass`` does)."""
        args = fx.node.map_arg(node.args, self._env.__getitem__)
        kwargs = fx.node.map_arg(node.kwargs, self._env.__getitem__)
        mark = last_node(self._graph)
        self._val_taken = False
        result = self._dispatch(node, args, kwargs, self._hook_meta(node))
        created = nodes_after(self._graph, mark)
        copied = (
            isinstance(result, ProxyValue)
            and result._copy
            and bool(created)
            and result.node is created[-1]
            and all(n.op == "get_attr" for n in created[:-1])  # attributes read again
        )
        if not copied:
            editor = self._editor
            if not editor.allow():  # a debug counter said no: copy instead
                for n in reversed(created):
                    self._build.erase(n, "refused")
                self._val_taken = False
                result = self._copy(node)
            else:
                self._changed = True
                self._rewrites += 1
                self._mark_provenance(node, created)
                editor.notify("replace", self.name, [node], created, "")
        elif not result._exact:
            self._changed = True  # an input changed upstream; this node was re-run on it
        self._env[node] = result

    def _hook_meta(self, node: fx.Node) -> Any:
        """The ``meta`` the hooks get for ``node``: a copy of its metadata."""
        return dict(node.meta)

    def _dispatch(self, node: fx.Node, args, kwargs, meta) -> Any:
        if node.op == "call_function" and node.target is operator.getitem:
            return self.call_getitem(args[0], args[1], meta)
        if node.op == "call_function":
            return self.call_operator(node.target, args, kwargs, meta)
        return self._emit_node(node.op, node.target, args, kwargs, meta)

    def _copy(self, node: fx.Node) -> ProxyValue:
        args = fx.node.map_arg(node.args, self._env.__getitem__)
        kwargs = fx.node.map_arg(node.kwargs, self._env.__getitem__)
        return self._emit_node(node.op, node.target, args, kwargs, dict(node.meta))

    def _mark_provenance(self, old: fx.Node, created: list[fx.Node]) -> None:
        where = self._where
        if where is None:  # once per run, at its first rewrite
            where = self._where = source_location(type(self).call_operator)
        self._editor.mark_new(created, [old], type(self).__name__, where, inherit=False)

    # ----- building nodes ------------------------------------------------------------------
    def _emit(self, op: Any, args, kwargs, meta) -> ProxyValue:
        return self._emit_node("call_function", op, args, kwargs, meta)

    def _emit_node(self, kind: str, target: Any, args, kwargs, meta) -> ProxyValue:
        old = self._current
        same = old is not None and old.op == kind and old.target is target
        copied, exact, reuse = self.same_inputs(old, args, kwargs) if same else (False,) * 3
        node_args = pytree.tree_map(self._as_arg, args)
        node_kwargs = pytree.tree_map(self._as_arg, kwargs)
        name = old.name if same else None
        node = self._build.create(self._graph, kind, target, node_args, node_kwargs, name=name)
        if exact and not self._val_taken:
            self._val_taken = True
            node.meta = dict(old.meta)
            return ProxyValue(node, old.meta.get("val"), exact=True)
        for key in _INHERITED:
            if key in meta:
                node.meta[key] = meta[key]
        if reuse and not self._val_taken and "val" in old.meta:
            self._val_taken = True
            val = old.meta["val"]
        else:
            val = self._fake_run(kind, target, args, kwargs, old if same else None)
        node.meta["val"] = val
        return ProxyValue(node, val, copy=copied)

    def same_inputs(self, old: fx.Node, args, kwargs) -> tuple[bool, bool, bool]:
        """Whether ``args``/``kwargs`` are the new values of the old node's inputs
        (``copied``); whether, besides, each of them is an unchanged copy (``exact``); and
        whether the old node's fake value still stands for the result (``reuse``: every new
        input has its old input's metadata, see :func:`~fxpass.fxutil.values.same_value`,
        and the op does not alias an input). One walk answers all three."""
        old_args, old_kwargs = old.args, old.kwargs
        if len(args) != len(old_args) or kwargs.keys() != old_kwargs.keys():
            return False, False, False
        env = self._env
        exact = reuse = True
        pairs: list[tuple[Any, Any]] = []  # nested lists and kwargs, after the arguments
        for new, was in zip(args, old_args):  # runs for every node of every interpreter pass
            if was.__class__ is not fx.Node:
                pairs.append((new, was))
                continue
            v = env.get(was)
            if v is not new:
                return False, False, False
            if not (isinstance(v, ProxyValue) and v._exact):
                exact = False
                reuse = reuse and _value_kept(v, was)
        pairs.extend((kwargs[k], old_kwargs[k]) for k in kwargs)
        while pairs:
            new, was = pairs.pop()
            if isinstance(was, fx.Node):
                v = env.get(was)
                if v is not new:
                    return False, False, False
                if not (isinstance(v, ProxyValue) and v._exact):
                    exact = False
                    reuse = reuse and _value_kept(v, was)
            elif isinstance(was, (list, tuple)):
                if not isinstance(new, (list, tuple)) or len(new) != len(was):
                    return False, False, False
                pairs.extend(zip(new, was))
            elif (
                isinstance(new, (ProxyValue, torch.Tensor))
                or type(new) is not type(was)
                or new != was
            ):
                return False, False, False
        return True, exact, exact or (reuse and not self._aliases(old.target))

    def _aliases(self, target: Any) -> bool:
        """Whether ``target``'s result may alias an input (then it is re-run, not reused)."""
        return returns_alias(target)

    def _as_arg(self, value: Any) -> Any:
        if isinstance(value, ProxyValue):
            return value.node
        if isinstance(value, torch.Tensor):
            return self._lift(value)
        return value

    def _lift(self, value: Any) -> Any:
        """A real tensor becomes a constant of the new module, read by a get_attr node."""
        if not isinstance(value, torch.Tensor):
            return value
        name = f"_tensor_constant{len(self._constants)}"
        while hasattr(self._gm, name) or name in self._constants:
            name += "_"
        self._constants[name] = value
        last = self._last_constant
        if last is not None and not is_erased(last):  # constants in the order they were made
            where = self._graph.inserting_after(last)
        else:
            first = next((n for n in self._graph.nodes if n.op != "placeholder"), None)
            if first is not None:
                where = self._graph.inserting_before(first)
            else:
                where = self._graph.inserting_after()
        with where:
            node = self._build.create(self._graph, "get_attr", name)
        self._last_constant = node
        node.meta["val"] = self._mode.from_tensor(value, static_shapes=True)
        return node

    def _fake_run(self, kind: str, target: Any, args, kwargs, old: fx.Node | None) -> Any:
        if kind not in ("call_function", "call_method"):
            return old.meta.get("val") if old is not None else None
        evaluator = self._fake
        fargs, fkwargs = evaluator.fake(pytree.tree_map_only(ProxyValue, _data, (args, kwargs)))
        try:
            return evaluator.run(target, fargs, fkwargs, kind=kind)
        except Exception as e:
            raise RuntimeError(
                f"{type(self).__name__}: running {target} on fake tensors failed while "
                f"rewriting '{self._current.name if self._current else '?'}': {e}"
            ) from e

    def _finish(self, gm: fx.GraphModule) -> fx.GraphModule:
        for n in list(self._graph.nodes):  # constants of rewrites a debug counter refused
            if n.op == "get_attr" and n.target in self._constants and not n.users:
                self._build.erase(n, "unused_constant")
                del self._constants[n.target]
        root: dict[str, Any] = dict(self._constants)
        for n in self._graph.nodes:
            if n.op in ("get_attr", "call_module") and n.target not in root:
                root[n.target] = get_path(gm, str(n.target))
        graph = self._graph
        copy_code_fields(gm.graph, graph)
        new = fx.GraphModule(root, graph, class_name=type(gm).__name__)
        new.meta = dict(gm.meta)
        return new


def _data(v: ProxyValue) -> Any:
    return v.data


#: ExecuTorch's name for the same base class, for code migrating from ``exir.pass_base``.
ExportPass = InterpreterPass
