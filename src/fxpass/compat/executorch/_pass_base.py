"""ExecuTorch's ``ExportPass`` on fxpass's interpreter: the same hooks, graphs and metadata,
without re-running the nodes a pass leaves alone.

ExecuTorch's ``ExportPass`` re-traces the whole graph under ``FakeTensorMode``: every node,
changed or not, runs its op on fake tensors (hundreds of microseconds each). This one calls
the same hooks with the same arguments (``ProxyValue``, ``NodeMetadata``), builds the same
graph (node names, order, ``get_attr`` constants and submodules) and gives every node the
metadata ExecuTorch gives it; but when a hook emits a node's own op on the new values of its
own inputs and those values have the old inputs' metadata, the node's ``meta['val']`` is
reused instead of recomputed (see :mod:`fxpass.fxutil.values`). Only nodes a pass creates or
feeds something new run on fake tensors.

Differences, on purpose:

* "modified" is honest: a pass that changes nothing returns the module it was given with
  ``modified=False`` (ExecuTorch's builds a copy and always says True);
* calling a pass runs it as a one-pass fxpass pipeline (a failure leaves the module as it
  was, instrumentation sees each rewrite), then re-raises the pass's own exception;
* the new module regenerates its Python code when first run or printed, not when built.
"""

from __future__ import annotations

import functools
import operator
from contextlib import nullcontext, suppress
from typing import Any

import torch
from executorch.exir import memory
from executorch.exir import pass_base as _et
from executorch.exir.delegate import executorch_call_delegate
from executorch.exir.dialects.edge._ops import EdgeOpOverload
from torch import fx
from torch._dispatch.python import enable_python_dispatcher
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.fx import traceback as fx_traceback
from torch.fx.graph import CodeGen

from ...core.context import current_context
from ...core.contract import PassResult
from ...core.errors import PassFailedError
from ...core.pipeline import Pipeline
from ...edit.editor import Editor
from ...fxutil.fx_internals import (
    codegen_of,
    default_node_name,
    last_node,
    make_lazy_module,
    nodes_after,
)
from ...fxutil.values import FAKE_RESULTS, FakeEvaluator, Strictness
from ...interpret import InterpreterPass
from ._values import (
    ProxyValue,
    RawInput,
    created_from,
    fake_data,
    is_symbolic,
    node_arg,
    preserve_placeholder_values,
    proxies,
    set_value_meta,
    settle_metadata,
    traced_meta,
)

__all__ = [
    "ExportPass",
    "ExportPassBaseError",
    "ExportedProgramPassBase",
    "ExportedProgramPassResult",
    "NodeMetadata",
    "PassResult",
    "ProxyValue",
    "map_args",
]

# ExecuTorch's own classes where they are plain data or errors, so that ``except`` clauses,
# ``isinstance`` checks and ExecuTorch's managers treat fxpass's objects as theirs.
NodeMetadata = _et.NodeMetadata
ExportPassBaseError = _et.ExportPassBaseError
ExportedProgramPassBase = _et.ExportedProgramPassBase
ExportedProgramPassResult = _et.ExportedProgramPassResult
map_args = _et.map_args

_NAMES: dict[Any, str] = {}  # target -> the node name ExecuTorch's tracer derives from it


@functools.cache
def _empty_module() -> fx.GraphModule:
    return make_lazy_module(torch.nn.Module(), fx.Graph())


def _interpreter() -> fx.Interpreter:
    """What runs ops on fake values for a pass (ExecuTorch's ``self.interpreter``): over an
    empty module whose code is never generated, one for every pass (it has nothing to
    change, and building a module for each of the thousands of passes a lowering runs
    costs more than the passes that change nothing)."""
    return fx.Interpreter(_empty_module())


def _emitted_by(target: Any, old: fx.Node) -> bool:
    return target is old.target or (type(target) is type(old.target) and target == old.target)


class ExportPass(InterpreterPass):
    """ExecuTorch's interpreter-based pass: override :meth:`call_operator` (and the other
    hooks); ``super().call_operator(op, args, kwargs, meta)`` emits ``op``.

    >>> class ReplaceAddWithMulSub(ExportPass):
    ...     def call_operator(self, op, args, kwargs, meta):
    ...         if op != exir_ops.edge.aten.add.Tensor:
    ...             return super().call_operator(op, args, kwargs, meta)
    ...         x, y = args
    ...         z = super().call_operator(exir_ops.edge.aten.mul.Tensor, (x, y), {}, meta)
    ...         return super().call_operator(exir_ops.edge.aten.sub.Tensor, (z, y), {}, meta)
    >>> new_gm = ReplaceAddWithMulSub()(graph_module).graph_module     # doctest: +SKIP
    """

    ExportTracer = _et.ExportPass.ExportTracer  # creates get_attr constants and submodules
    _rewrites = 0
    _val_taken = False

    def __init__(self) -> None:
        self.interpreter = _interpreter()
        self._tracer = None  # made when first asked for (most passes never do before a run)
        self.fake_tensor_mode: FakeTensorMode | None = None
        self._initialized = True

    # ----- ExecuTorch's attributes -----------------------------------------------------------
    @property
    def tracer(self) -> Any:
        """The tracer building the new graph (ExecuTorch's ``ExportTracer``)."""
        if self.__dict__.get("_meta_for", None) is not self.__dict__.get("_current", None):
            self._install_current_meta()
        if self._tracer is None:
            self._tracer = self.ExportTracer(self, CodeGen())
            self._tracer.fake_tensor_mode = self.fake_tensor_mode
        return self._tracer

    @tracer.setter
    def tracer(self, tracer: Any) -> None:
        self._tracer = tracer

    @property
    def node_debug_str(self) -> str | None:
        """The node being rewritten, as ``Node.format_node`` prints it."""
        current = self.__dict__.get("_current")
        return self.__dict__.get("_debug_str") or (current.format_node() if current else None)

    @node_debug_str.setter
    def node_debug_str(self, text: str | None) -> None:
        self._debug_str = text

    @staticmethod
    def _create_dummy_node_metadata() -> NodeMetadata:
        return _et._ExportPassBase._create_dummy_node_metadata()

    def _install_current_meta(self) -> None:
        """What torch's interpreter sets while it runs a node: nodes the tracer creates copy
        its stack trace and module stack (done only when a hook reaches for the tracer)."""
        node = self.__dict__.get("_current")
        self._meta_for = node
        if node is None or not fx_traceback.has_preserved_node_meta() or not node.meta:
            return
        meta = node.meta.copy()
        meta["from_node"] = created_from(node)
        fx_traceback.current_meta = meta

    # ----- hooks ------------------------------------------------------------------------------
    def on_attr(self, attr: ProxyValue) -> None:
        pass

    def should_preserve_symbolic_input_metadata(self) -> bool:
        """Whether to check that inputs keep their symbolic sizes (override to allow it)."""
        return True

    def placeholder(self, name: str, arg: Any, meta: NodeMetadata) -> ProxyValue:
        # the node ExecuTorch's tracer makes; its metadata is replaced by ``meta`` anyway
        node = self._build.create(self._graph, "placeholder", name)
        node.meta = meta.data
        node.meta["val"] = arg
        return ProxyValue(arg, self._tracer.proxy(node))

    def call_operator(self, op, args, kwargs, meta: NodeMetadata) -> ProxyValue:  # type: ignore[override]
        return self._fx("call_function", op, args, kwargs, meta)

    def call_size_operator(
        self, tensor_proxy: ProxyValue, dim: int, meta: NodeMetadata, *, edge_dialect=False
    ) -> ProxyValue | int:
        """``tensor_proxy.size(dim)``: an int, or a ``sym_size`` node for a symbolic size."""
        return _et._ExportPassBase.call_size_operator(
            self, tensor_proxy, dim, meta, edge_dialect=edge_dialect
        )

    def call_size_operator_all(
        self, tensor_proxy: ProxyValue, meta: NodeMetadata, *, edge_dialect=False
    ) -> list[ProxyValue | int]:
        return [
            self.call_size_operator(tensor_proxy, d, meta, edge_dialect=edge_dialect)
            for d in range(len(tensor_proxy.data.shape))
        ]

    def call_sym(self, target, args, meta: NodeMetadata) -> ProxyValue:
        return self._fx("call_function", target, args, {}, meta)

    def call_cond(self, pred, true_fn, false_fn, inputs, meta: NodeMetadata) -> ProxyValue:
        true_branch = self.call_submodule(true_fn, tuple(inputs))
        false_branch = self.call_submodule(false_fn, tuple(inputs))
        args = (pred, true_branch.graph_module, false_branch.graph_module, list(inputs))
        return self._fx("call_function", torch.ops.higher_order.cond, args, {}, meta)

    def call_while(self, cond_fn, body_fn, carried_inputs, additional_inputs, meta):
        cond_fn = self.call_submodule(cond_fn, (*carried_inputs, *additional_inputs))
        body_fn = self.call_submodule(body_fn, (*carried_inputs, *additional_inputs))
        args = (cond_fn.graph_module, body_fn.graph_module, carried_inputs, additional_inputs)
        return self._fx("call_function", torch.ops.higher_order.while_loop, args, {}, meta)

    def call_map(self, f, mapped_args, operands, meta: NodeMetadata) -> ProxyValue:
        xs = _et._unstack_pytree([arg.data for arg in mapped_args])[0]
        f_branch = self.call_submodule(f, tuple(xs + [arg.data for arg in operands]))
        args = (f_branch.graph_module, mapped_args, operands)
        return self._fx("call_function", torch.ops.higher_order.map_impl, args, {}, meta)

    def call_scan(self, combine_fn, init, xs, additional_inputs, meta) -> ProxyValue:
        phs = [n for n in combine_fn.graph.nodes if n.op == "placeholder"]
        xs_data = [phs[len(init) + i].meta["val"] for i in range(len(xs))]
        result = self.call_submodule(combine_fn, (*init, *xs_data, *additional_inputs))
        args = (result.graph_module, init, xs, additional_inputs)
        return self._fx("call_function", torch.ops.higher_order.scan, args, {}, meta)

    def call_getitem(self, value: ProxyValue, key: int, meta: NodeMetadata) -> ProxyValue:  # type: ignore[override]
        return self._fx("call_function", operator.getitem, (value, key), {}, meta)

    def call_delegate(self, lowered_module, args, kwargs, meta: NodeMetadata) -> ProxyValue:
        args = (lowered_module, *args)
        return self._fx("call_function", executorch_call_delegate, args, kwargs, meta)

    def output(self, results: list[Any], meta: NodeMetadata) -> ProxyValue:  # type: ignore[override]
        return self._fx("output", "output", (results,), {}, meta)

    # ----- running ----------------------------------------------------------------------------
    def inputs(self, graph_module: fx.GraphModule) -> list[Any]:
        """The fake inputs the graph is run on: ``meta['args']``, or each placeholder's value."""
        return _et._ExportPassBase.inputs(self, graph_module)

    def execute(self, gm: fx.GraphModule, ctx: Any) -> Any:
        self.requires(gm)
        # ExecuTorch's call(graph_module) takes no context: the hooks find it here
        outer, self._ctx = self.__dict__.get("_ctx"), ctx
        try:
            result = self.call(gm)
        finally:
            self._ctx = outer
        self.ensures(gm)  # ExecuTorch checks the module it was given
        self._claimed = getattr(result, "modified", None)
        return result

    def __call__(self, graph_module: fx.GraphModule, *args: Any, **kwargs: Any) -> PassResult:
        # a one-pass pipeline, without lint: ExecuTorch's pass does not lint, and the new
        # graph is built node by node from a valid one
        pipeline = Pipeline([self], name=self.name, lint=False)
        outer, self._claimed = self.__dict__.get("_claimed"), None
        try:
            result = pipeline.run(graph_module, *args, **kwargs)
        except PassFailedError as e:  # the module is restored; raise what the pass raised
            if e.pass_name != self.name or e.cause is None:
                raise
            raise e.cause.with_traceback(e.cause.__traceback__) from e.cause.__cause__
        finally:
            claimed, self._claimed = self._claimed, outer
        if claimed is None or bool(claimed) == result.modified:
            return result
        # what the pass's call() said, as ExecuTorch returns it (a pass may rebuild the graph
        # and say nothing changed); the pipeline counted the new module as a change
        return PassResult(result.graph_module, claimed, result.stats, report=result.report)

    def call(self, graph_module: fx.GraphModule) -> PassResult:
        if not getattr(self, "_initialized", False):
            raise ExportPassBaseError("ExportPass is not initialized with __init__().")
        inputs = self.inputs(graph_module)
        mode = None
        for i in inputs:
            if isinstance(i, FakeTensor):
                assert mode is None or mode is i.fake_mode, "Multiple fake tensor mode detected."
                mode = i.fake_mode
        if mode is None:
            mode = FakeTensorMode(allow_non_fake_inputs=True)
            dispatcher: Any = nullcontext()
        else:
            mode.allow_non_fake_inputs = True
            dispatcher = enable_python_dispatcher()
        if self._tracer is not None:
            self._tracer.fake_tensor_mode = mode
        self.fake_tensor_mode = mode
        self._rewrites = 0
        with mode, dispatcher:
            result = self.call_submodule(graph_module, tuple(inputs))
        if result.graph_module is graph_module:
            return PassResult(graph_module, False)
        return PassResult(result.graph_module, True, {"rewritten": self._rewrites})

    _STATE = (
        "_tracer",
        "interpreter",
        "_graph",
        "_env",
        "_changed",
        "_current",
        "_meta_for",
        "_val_taken",
    )

    def call_submodule(self, graph_module: fx.GraphModule, inputs: tuple[Any, ...]) -> PassResult:
        """Run the hooks over ``graph_module`` on ``inputs``; a new module, or the same one
        when every node came out as a copy of itself."""
        saved = {k: self.__dict__.get(k) for k in self._STATE}
        tracer = self.ExportTracer(self, codegen_of(graph_module.graph))
        outer = saved["_tracer"]
        tracer.fake_tensor_mode = self.fake_tensor_mode if outer is None else outer.fake_tensor_mode
        self._tracer = tracer
        self.interpreter = _interpreter()
        self._graph, self._env, self._changed = tracer.graph, {}, False
        self._current = self._meta_for = None
        # the context execute was handed; called from elsewhere, the run in progress's
        ctx = self.__dict__.get("_ctx") or current_context()
        self._editor = ctx.editor.naming(self.name) if ctx is not None else Editor(None, self.name)
        self._build = Editor(None, self.name)  # builds the tracer's new graph: no run watches it
        data = fake_data(inputs)
        try:
            with fx_traceback.preserve_node_meta():
                self._run_graph(graph_module, data)
            if self._changed:
                new_gm = make_lazy_module(tracer.root, tracer.graph)
            else:
                new_gm = graph_module
                settle_metadata(graph_module, tracer)
            self._validate_symbolic_input_snapshots(graph_module, new_gm)
            if new_gm is not graph_module:
                new_gm.meta = graph_module.meta.copy()
        finally:
            self.__dict__.update(saved)
        if new_gm is not graph_module:
            preserve_placeholder_values(graph_module, new_gm)
        return PassResult(new_gm, True)

    def _run_graph(self, gm: fx.GraphModule, inputs: Any) -> None:
        args = iter(gm.graph.process_inputs(*inputs))
        for node in gm.graph.nodes:
            self._current = node
            try:
                self._run_node(gm, node, args)
            except Exception as e:
                _add_node_context(e, node)
                if isinstance(e, KeyError):
                    raise RuntimeError(*e.args) from e
                raise

    def _run_node(self, gm: fx.GraphModule, node: fx.Node, args: Any) -> None:
        op = node.op
        if op == "call_function":
            self.rewrite_node(node)
        elif op == "placeholder":
            self._env[node] = self._input(node, args)
        elif op == "get_attr":
            self._env[node] = _fetch_attr(gm, node.target)
            self._changed = True  # ExecuTorch re-creates attributes where they are used
        elif op == "output":
            results = fx.node.map_arg(node.args[0], self._env.__getitem__)
            out = self.output(results, NodeMetadata(node.meta))
            expected = fx.node.map_arg(node.args, self._new_node_or_none)
            if not isinstance(out, _et.ProxyValue) or out.node.args != expected:
                self._changed = True
        elif op == "call_module":
            raise ExportPassBaseError("call_module is not supported.")
        elif op == "call_method":
            raise ExportPassBaseError("call_method is not supported.")

    def _input(self, node: fx.Node, args: Any) -> Any:
        target = node.target
        if target.startswith("*"):
            arg = list(args)
        else:
            try:
                arg = next(args)
            except StopIteration as si:
                if not node.args:
                    raise RuntimeError(
                        f"Expected positional argument for parameter {target}, but one was "
                        "not passed in!"
                    ) from si
                arg = node.args[0]
        old_val = node.meta.get("val")
        mark = last_node(self._graph)
        value = self.placeholder(target, arg, NodeMetadata(node.meta))
        created = nodes_after(self._graph, mark)
        # an input whose fake value holds a constant runs as that constant (as in ExecuTorch)
        was = (old_val, getattr(old_val, "constant", None) if old_val is not None else None)
        same = (
            isinstance(value, ProxyValue)
            and len(created) == 1
            and created[0] is value.node
            and value.data is not None
            and any(value.data is w for w in was)
            and value.node.name == node.name
            and value.node.meta.get("val") is value.data
        )
        if same:
            value._copy = value._exact = True
        else:
            self._changed = True
        return value

    def _new_node_or_none(self, n: fx.Node) -> Any:
        v = self._env.get(n)
        return v.node if isinstance(v, _et.ProxyValue) else None

    def _hook_meta(self, node: fx.Node) -> NodeMetadata:
        return NodeMetadata(node.meta)

    def _dispatch(self, node: fx.Node, args, kwargs, meta) -> Any:
        target = node.target
        if target == operator.getitem:
            value, key = args
            return self.call_getitem(value, key, meta)
        if isinstance(target, EdgeOpOverload):
            return self.call_operator(target, args, kwargs, meta)
        if target == memory.alloc:
            return self._fx("call_function", target, args, kwargs, meta)
        if target == executorch_call_delegate:
            return self.call_delegate(args[0], args[1:], kwargs, NodeMetadata(node.meta))
        if getattr(target, "__module__", None) in {"_operator", "builtins", "math"}:
            return self.call_sym(target, args, meta)
        if target in _et._TORCH_SYM_OPS:
            return self.call_sym(target, args, meta)
        if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
            return self.call_operator(target, args, kwargs, meta)
        hop = torch.ops.higher_order
        if target == hop.cond:
            pred, true_fn, false_fn, inputs = args
            return self.call_cond(pred, true_fn, false_fn, inputs, meta)
        if target == hop.while_loop:
            cond, body, carried_inputs, additional_inputs = args
            return self.call_while(cond, body, carried_inputs, additional_inputs, meta)
        if target == hop.map_impl:
            f, mapped_args, operands = args
            return self.call_map(f, mapped_args, operands, meta)
        if target == hop.scan:
            combine_fn, init, xs, additional_inputs = args
            return self.call_scan(combine_fn, init, xs, additional_inputs, meta)
        if isinstance(target, torch._ops.HigherOrderOperator):
            return self._fx("call_function", target, args, kwargs, meta)
        raise ExportPassBaseError(f"Unsupported target type: {target}")

    def _copy(self, node: fx.Node) -> Any:
        args = fx.node.map_arg(node.args, self._env.__getitem__)
        kwargs = fx.node.map_arg(node.kwargs, self._env.__getitem__)
        return self._fx(node.op, node.target, args, kwargs, NodeMetadata(node.meta))

    def _mark_provenance(self, old: fx.Node, created: list[fx.Node]) -> None:
        pass  # nodes carry exactly the metadata ExecuTorch gives them

    # ----- building nodes ---------------------------------------------------------------------
    def _fx(self, kind: str, target: Any, args, kwargs, meta: NodeMetadata) -> ProxyValue:
        """Emit ``target(*args, **kwargs)`` as a ``kind`` node with ``meta``: the node
        ExecuTorch's tracer makes, with the value ExecuTorch computes."""
        old = self._current
        reuse = exact = False
        if (
            kind == "call_function"
            and old is not None
            and old.op == kind
            and not self._val_taken
            and "val" in old.meta
            and _emitted_by(target, old)
        ):
            copied, exact, reuse = self.same_inputs(old, args, kwargs)
            if copied and not reuse and target is operator.getitem:  # the same element
                reuse = args[0].data is old.args[0].meta.get("val")
        if reuse:
            self._val_taken = True
            value = old.meta["val"]
        else:
            value = self._run(kind, target, fake_data(args), fake_data(kwargs))
        result = self._create(kind, target, args, kwargs, meta, value)
        result._copy = reuse
        result._exact = reuse and exact
        return result

    def _run(self, kind: str, target: Any, args: Any, kwargs: Any) -> Any:
        """Run ``target`` on fake values as ExecuTorch does (its interpreter, in the pass's
        mode), through fxpass's one fake-value evaluator: strict, as ExecuTorch is (a
        kernel's error propagates, with a note naming the op), and an op call takes the
        result of an earlier run on inputs with the same metadata."""
        evaluator = self.__dict__.get("_evaluator")
        if evaluator is None or evaluator.mode is not self.fake_tensor_mode:
            evaluator = self._evaluator = FakeEvaluator(
                self.fake_tensor_mode,
                strictness=Strictness.RAISE,
                cache=FAKE_RESULTS,
                owner=type(self).__name__,
            )
        return evaluator.run(target, args, kwargs, kind=kind, call=getattr(self.interpreter, kind))

    def _create(self, kind: str, target: Any, args, kwargs, meta: NodeMetadata, value: Any):
        """The node ExecuTorch's tracer creates for ``target(*args, **kwargs)``. Arguments of
        graph values and literals are mapped here; tensors, modules and other objects go
        through the tracer (it makes them attributes of the new module)."""
        try:
            node_args, node_kwargs = node_arg(args), node_arg(kwargs)
        except RawInput:
            args_proxy, kwargs_proxy = proxies(args), proxies(kwargs)
            tracer = self.tracer
            proxy = tracer.create_proxy(
                kind, target, args_proxy, kwargs_proxy, name=self._node_name(target)
            )
            proxy.node.meta.update(meta.data)
            tracer.set_metadata(proxy.node, value)
            return ProxyValue(value, proxy)
        # the editor sets the arguments after creation: Graph.create_node walks them with
        # pytree to warn about raw SymInts (which node_arg never lets through)
        node = self._build.create(
            self._graph, kind, target, node_args, node_kwargs,
            name=self._candidate_name(target),
        )  # fmt: skip
        traced_meta(self._current, meta.data, node.meta)
        set_value_meta(self._tracer, node, value)
        return ProxyValue(value, self._tracer.proxy(node))

    def _node_name(self, target: Any) -> str | None:
        """The name ExecuTorch asks for (the graph adds a suffix where it is taken)."""
        if isinstance(target, torch._ops.OpOverload):
            return default_node_name(self._graph, target.overloadpacket.__name__)
        return None

    def _candidate_name(self, target: Any) -> str:
        """What the graph derives from :meth:`_node_name`, computed once per target."""
        try:
            return _NAMES[target]
        except (KeyError, TypeError):
            name = self._node_name(target) or default_node_name(self._graph, target)
        with suppress(TypeError):
            _NAMES[target] = name
        return name

    # ----- checks -----------------------------------------------------------------------------
    def _capture_symbolic_input_snapshots(self, graph_module: fx.GraphModule) -> list[Any]:
        return [
            _et._extract_symbolic_snapshot(node.meta.get("val"))
            for node in graph_module.graph.nodes
            if node.op == "placeholder"
        ]

    def _validate_symbolic_input_snapshots(
        self, graph_module: fx.GraphModule, new_graph_module: fx.GraphModule
    ) -> None:
        if not self.should_preserve_symbolic_input_metadata():
            return
        inputs = [n.meta.get("val") for n in graph_module.graph.nodes if n.op == "placeholder"]
        if not any(map(is_symbolic, inputs)):  # nothing to preserve (and no pytree walk)
            return
        before = self._capture_symbolic_input_snapshots(graph_module)
        if all(snapshot is None for snapshot in before):
            return
        after = self._capture_symbolic_input_snapshots(new_graph_module)
        for index, snapshot in enumerate(before):
            if snapshot is None:
                continue
            if index >= len(after) or after[index] != snapshot:
                raise ExportPassBaseError(
                    f"Input at position {index} did not preserve symbolic metadata across "
                    "pass replay."
                )


def _fetch_attr(gm: fx.GraphModule, target: str) -> Any:
    atoms = target.split(".")
    obj: Any = gm
    for i, atom in enumerate(atoms):
        if not hasattr(obj, atom):
            raise RuntimeError(f"Node referenced nonexistent target {'.'.join(atoms[: i + 1])}")
        obj = getattr(obj, atom)
    return obj


def _add_node_context(e: Exception, node: fx.Node) -> None:
    """What torch's interpreter adds to an error raised while running ``node``."""
    msg = f"While executing {node.format_node()}"
    msg = f"{e.args[0]}\n\n{msg}" if e.args else str(msg)
    msg += f"\nOriginal traceback:\n{node.stack_trace}"
    msg += "\nUse tlparse to see full graph. "
    msg += (
        "(https://github.com/pytorch/tlparse?tab=readme-ov-file#tlparse-parse-structured-pt2-logs)"
    )
    e.args = (msg, *e.args[1:])


# ExecuTorch's code asks ``isinstance(p, ExportPass)`` / ``issubclass``: say yes for ours.
_et.ExportPass.register(ExportPass)
