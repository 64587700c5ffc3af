"""Tracing functions into patterns and replacements: once, with symbolic sizes.

Inductor traces a search function with the example inputs (sizes are then ignored), and for
every match traces it again, and the replacement, with the matched values. Here both are
traced once, by the same ``trace_fn`` (``fwd_only``...), with fake inputs whose every size
and stride is a symbol passed in as an extra leading input (as Inductor's own dynamic-shape
re-trace does). What depends on sizes is then a computation on those symbols, not a number:

* in a pattern (:func:`graph_to_pattern`) it becomes a :class:`SizeExpr` computed from the
  matched inputs' sizes (or, for the first, size-blind match, ``Ignored``);
* in a replacement it is recomputed for each match by :mod:`._replay` (a number for static
  sizes, ``sym_size`` nodes for symbolic ones).

The trace records the assumptions it made about the sizes (its guards); a match whose sizes
break them gets a trace of its own (see :mod:`._recipes`).
"""

from __future__ import annotations

import itertools
import operator
import re
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import fx
from torch.fx import Node
from torch.fx.experimental.proxy_tensor import make_fx

from ...fxutil.fx_internals import use_plain_codegen
from ._exprs import (
    CallFunction,
    ExclusiveKeywordArg,
    Ignored,
    KeywordArg,
    MultiOutputPattern,
    PatternExpr,
    SizeExpr,
)
from ._fake_memo import memoized_fake_kernels

__all__ = [
    "SymbolicTrace",
    "fwd_only",
    "fx_to_pattern",
    "graph_to_pattern",
    "joint_fwd_bwd",
    "size_of",
    "trace_symbolic",
]

#: Inductor's initial pattern ignores these literal types (sizes get burned into them).
IGNORED_TYPES = (int, float, list, torch.device, torch.dtype)


def _decomps(get_decomp_fn: Callable[..., Any] | None) -> Any:
    if get_decomp_fn is None:
        from torch._inductor.decomposition import select_decomp_table

        get_decomp_fn = select_decomp_table
    return get_decomp_fn()


@torch.no_grad()
def fwd_only(
    fn: Callable[..., Any],
    args: Sequence[Any],
    *,
    run_functional_passes: bool = True,
    get_decomp_fn: Callable[..., Any] | None = None,
) -> fx.GraphModule:
    """An inference graph of ``fn(*args)`` in Inductor's dialect (its decompositions, its
    no-op removal), as Inductor's ``fwd_only`` builds it."""
    from torch._dispatch.python import enable_python_dispatcher
    from torch.fx._lazy_graph_module import _use_lazy_graph_module
    from torch.fx.traceback import preserve_node_meta

    # the module's Python code is generated when first needed (a pattern reads the graph only)
    with _use_lazy_graph_module(True):
        with enable_python_dispatcher(), preserve_node_meta(), memoized_fake_kernels(args):
            gm = make_fx(fn, _decomps(get_decomp_fn), tracing_mode="real")(*args)
        if run_functional_passes:
            from torch._inductor.fx_passes.post_grad import remove_noop_ops

            remove_noop_ops(gm.graph)
            gm.graph.eliminate_dead_code()
        gm.recompile()
    return gm


@torch.enable_grad()
def joint_fwd_bwd(
    fn: Callable[..., Any],
    args: Sequence[Any],
    *,
    get_decomp_fn: Callable[..., Any] | None = None,
) -> fx.GraphModule:
    """The joint forward+backward graph of ``fn(*args)`` (AOTAutograd's, in Inductor's
    dialect), as Inductor's ``joint_fwd_bwd`` builds it."""
    from torch._functorch.aot_autograd import aot_function, make_boxed_func
    from torch._functorch.partitioners import default_partition

    joint: list[fx.GraphModule] = []

    def keep_joint(graph: fx.GraphModule, inputs: Sequence[Any], **kwargs: Any) -> Any:
        joint.append(_clone(graph))
        return default_partition(graph, inputs, **kwargs)

    with torch._guards.tracing(None):
        aot_function(
            fn,
            lambda gm, example_inputs: make_boxed_func(gm),
            partition_fn=keep_joint,
            decompositions=_decomps(get_decomp_fn),
            keep_inference_input_mutations=True,
            enable_log=False,
        )(*args)
    gm = joint[0]
    from torch._inductor.fx_passes.joint_graph import early_patterns
    from torch._inductor.fx_passes.post_grad import remove_noop_ops

    remove_noop_ops(gm.graph)
    early_patterns.apply(gm.graph)
    use_plain_codegen(gm.graph)  # no input/output pytree specs
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return gm


def _clone(gm: fx.GraphModule) -> fx.GraphModule:
    graph = fx.Graph()
    env: dict[Node, Node] = {}
    out = graph.graph_copy(gm.graph, env)
    graph.output(out)
    for old, new in env.items():
        new.meta.update(old.meta)
    return fx.GraphModule(gm, graph)


# ----- symbolic tracing -------------------------------------------------------------------
@dataclass
class SymbolicTrace:
    """A graph traced with symbolic sizes: its first ``len(sources)`` placeholders are the
    size symbols, ``sources[i]`` saying where symbol i comes from (input index, "size" or
    "stride", dim); ``guards`` are the assumptions the trace made (sympy expressions over
    ``symbols``: symbol -> source)."""

    gm: fx.GraphModule
    sources: list[tuple[int, str, int]]
    guards: list[Any] = field(default_factory=list)
    symbols: dict[Any, tuple[int, str, int]] = field(default_factory=dict)


def _symbolic_inputs(inputs: Sequence[Any]) -> tuple[Any, list, list, list]:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import (
        DimDynamic,
        ShapeEnv,
        StatelessSymbolicContext,
        statically_known_true,
    )

    mode = FakeTensorMode(shape_env=ShapeEnv(duck_shape=False))
    leaves, spec = pytree.tree_flatten(list(inputs))
    fakes: list[Any] = []
    syms: list[Any] = []
    sources: list[tuple[int, str, int]] = []
    for i, x in enumerate(leaves):
        if not isinstance(x, torch.Tensor):
            fakes.append(x)
            continue
        ctx = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC] * x.dim())
        f = mode.from_tensor(x, symbolic_context=ctx)
        fakes.append(f)
        for kind, values in (("size", f.shape), ("stride", f.stride())):
            for d, v in enumerate(values):
                if isinstance(v, torch.SymInt) and all(
                    not statically_known_true(v == s) for s in syms
                ):
                    syms.append(v)
                    sources.append((i, kind, d))
    return mode, pytree.tree_unflatten(fakes, spec), syms, sources


def trace_symbolic(
    trace: Callable[[Callable[..., Any], list[Any]], fx.GraphModule],
    fn: Callable[..., Any],
    inputs: Sequence[Any],
) -> SymbolicTrace:
    """``trace(fn', syms + fakes)``: ``fn`` traced with symbolic sizes (see the module
    docstring). ``inputs`` are example values, one per parameter of ``fn`` (tensors, or
    pytrees of them, stand for their dtype, device, rank and which sizes are 0 or 1);
    ``sources`` index their leaves."""
    mode, fakes, syms, sources = _symbolic_inputs(inputs)
    n = len(syms)

    def with_sizes(*args: Any, **_: Any) -> Any:
        return fn(*args[n:])

    with mode:
        gm = trace(with_sizes, [*syms, *fakes])
    env = mode.shape_env
    symbols = {}
    for s, src in zip(syms, sources):
        expr = s.node.expr
        if getattr(expr, "is_Symbol", False):
            symbols[expr] = src
    guards = [g.expr for g in env.guards]
    return SymbolicTrace(gm, sources, guards, symbols)


def size_of(node: Any, kind: str, dim: int) -> Any:
    """A size or stride of a matched value (from its ``meta['val']``)."""
    if isinstance(node, Node):
        val = node.meta.get("val", node.meta.get("example_value"))
        if not isinstance(val, torch.Tensor):
            raise LookupError(f"%{node.name} has no tensor meta['val'] to read its sizes from")
    elif isinstance(node, torch.Tensor):
        val = node
    else:
        raise LookupError(f"{node!r} is not a tensor")
    return val.size(dim) if kind == "size" else val.stride(dim)


# ----- graphs -> patterns -------------------------------------------------------------------
_SYM_VALUES = (torch.SymInt, torch.SymFloat, torch.SymBool)


def _is_size_node(n: Node) -> bool:
    return isinstance(n.meta.get("val"), _SYM_VALUES)


def graph_to_pattern(
    gm: fx.GraphModule,
    *,
    argnames: Sequence[str] = (),
    ignore_types: Collection[type] = (),
    scalar_workaround: dict[str, float | int] | None = None,
    exclusive_arg_names: Collection[str] = (),
    sources: Sequence[tuple[int, str, int]] = (),
) -> PatternExpr:
    """Inductor's ``fx_to_pattern`` for a graph whose first ``len(sources)`` placeholders are
    size symbols: what is computed from them becomes a :class:`SizeExpr` reading the matched
    inputs' sizes (input i is the keyword ``argnames[i]``), or ``Ignored`` when ``int`` is
    among ``ignore_types`` (the first, size-blind pattern)."""
    workaround = {v: k for k, v in (scalar_workaround or {}).items()}
    if len(workaround) != len(scalar_workaround or {}):
        raise ValueError("scalar_workaround values must be distinct")
    blind = int in ignore_types
    env: dict[Node, Any] = {}
    argnum = itertools.count()
    n_sym = len(sources)

    def process(x: Any, types: Collection[type]) -> Any:
        if isinstance(x, _Size):
            return Ignored() if blind else SizeExpr(x.fn, x.text)
        if isinstance(x, (float, int)) and not isinstance(x, bool) and x in workaround:
            return KeywordArg(workaround[x])
        if type(x) in types:
            return Ignored()
        return x

    def value(a: Any, types: Collection[type]) -> Any:
        if isinstance(a, Node):
            v = env[a]
            return process(v, ()) if isinstance(v, _Size) else v
        if isinstance(a, (list, tuple)):
            return type(a)(value(x, types) for x in a)
        if isinstance(a, dict):
            return {k: value(v, types) for k, v in a.items()}
        return process(a, types)

    def collapse(a: Any) -> Any:  # a list of sizes alone ignored is ignored whole
        if isinstance(a, list) and a and all(isinstance(x, Ignored) for x in a):
            return Ignored()
        return a

    for n in gm.graph.nodes:
        if n.op == "placeholder":
            i = next(argnum)
            if i < n_sym:
                env[n] = _Size.symbol(sources[i], argnames)
                continue
            j = i - n_sym
            if j < len(argnames):
                name = argnames[j]
            elif argnames:
                if not str(n.target).startswith("tangent"):
                    raise ValueError(f"placeholder {n.target} has no name among {list(argnames)}")
                name = n.target
            else:
                name = re.sub(r"_\d+$", "", n.target)
            env[n] = ExclusiveKeywordArg(name) if name in exclusive_arg_names else KeywordArg(name)
        elif n.op == "call_function":
            if _is_size_node(n):
                env[n] = _Size.call(
                    n.target, [env[a] if isinstance(a, Node) else a for a in n.args]
                )
                continue
            types = (
                tuple(t for t in ignore_types if t is not int)
                if n.target is operator.getitem
                else ignore_types
            )
            args = [value(a, types) for a in n.args]
            kwargs = {k: value(v, types) for k, v in n.kwargs.items()}
            if list in ignore_types:
                args = [collapse(a) for a in args]
                kwargs = {k: collapse(v) for k, v in kwargs.items()}
            p = CallFunction(n.target, *args, **kwargs)
            p.users = sum(1 for u in n.users if not _is_size_node(u))
            env[n] = p
        elif n.op == "output":
            out = value(n.args[0], ())
            if isinstance(out, (list, tuple)):
                return MultiOutputPattern(_leaves(out))
            if isinstance(out, CallFunction):
                out.users = 0  # Inductor counts the output node's users here (an output is exempt)
            return out
        else:
            raise NotImplementedError(
                f"patterns cannot contain {n.op} nodes ({n.name}: {n.target}); pass tensors in "
                "as inputs of the search function"
            )
    raise ValueError("the graph has no output")


def fx_to_pattern(
    gm: fx.GraphModule | fx.Graph,
    ignore_types: Sequence[type] = (),
    argnames: Sequence[str] = (),
    scalar_workaround: dict[str, float | int] | None = None,
    exclusive_arg_names: Sequence[str] = (),
) -> PatternExpr:
    """Convert a traced graph into a pattern (Inductor's ``fx_to_pattern``): placeholders
    become ``KeywordArg``\\ s named ``argnames`` (``ExclusiveKeywordArg`` for
    ``exclusive_arg_names``), literals of ``ignore_types`` ``Ignored``, the literals equal to
    a ``scalar_workaround`` value that keyword, several returned values a
    ``MultiOutputPattern``."""
    if not isinstance(gm, fx.GraphModule):
        raise TypeError(f"fx_to_pattern needs a GraphModule, got {type(gm).__name__}")
    return graph_to_pattern(
        gm,
        argnames=argnames,
        ignore_types=tuple(ignore_types),
        scalar_workaround=scalar_workaround,
        exclusive_arg_names=exclusive_arg_names,
    )


class _Size:
    """A value computed from input sizes while converting a symbolic graph."""

    __slots__ = ("fn", "text")

    def __init__(self, fn: Callable[[dict[str, Any]], Any], text: str) -> None:
        self.fn = fn
        self.text = text

    @staticmethod
    def symbol(source: tuple[int, str, int], input_names: Sequence[str | None]) -> Any:
        i, kind, d = source
        name = input_names[i] if i < len(input_names) else None
        if name is None:  # a size of a value the pattern does not bind: not checked
            return Ignored()
        return _Size(lambda env: size_of(env[name], kind, d), f"{name}.{kind}({d})")

    @staticmethod
    def call(target: Any, args: list[Any]) -> Any:
        if target in _SIZE_OF and isinstance(args[0], KeywordArg) and len(args) == 2:
            name, kind, d = args[0].name, _SIZE_OF[target], args[1]
            return _Size(lambda env: size_of(env[name], kind, d), f"{name}.{kind}({d})")
        if any(isinstance(a, PatternExpr) for a in args):  # a size of an inner value
            return Ignored()
        text = f"{getattr(target, '__name__', target)}({', '.join(getattr(a, 'text', repr(a)) for a in args)})"

        def fn(env: dict[str, Any]) -> Any:
            return target(*[a.fn(env) if isinstance(a, _Size) else a for a in args])

        return _Size(fn, text)


_SIZE_OF = {torch.ops.aten.sym_size.int: "size", torch.ops.aten.sym_stride.int: "stride"}


def _leaves(x: Any) -> list[Any]:
    if isinstance(x, (list, tuple)):
        return [y for v in x for y in _leaves(v)]
    return [x]
