"""Traced patterns: a pattern and its replacement written as ordinary PyTorch functions.

>>> import torch
>>> from fxpass.rewrite import traced_rule
>>> def pattern(x, residual, weight, eps):
...     s = x + residual
...     h = s.float()
...     h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
...     return weight * h.to(s.dtype), s
>>> def replacement(x, residual, weight, eps):
...     out = torch.ops.fxpass.fused_add_rmsnorm(x, residual, weight, eps)
...     return out[0], out[1]
>>> example_inputs = (torch.randn(2, 8), torch.randn(2, 8), torch.ones(8), 1e-6)
>>> rule = traced_rule(pattern, replacement, example_inputs, ir="aten")
>>> rule.pattern                     # eps is a wildcard, captured as ``eps``
aten.mul.Tensor(weight, aten.mul.Tensor(aten.add.Tensor(x, residual)..., const(eps)))))

Both functions are traced once, with the example inputs, into the same IR as the graph the
rule will run on — patterns only match graphs of their own dialect:

========= ===========================================================================
ir         how the functions are traced (the graphs they then match)
========= ===========================================================================
aten       ``torch.export`` + ``run_decompositions()``: core ATen (exported programs)
export     ``torch.export`` without decompositions (training-IR exported programs)
aot        AOTAutograd's inference graph (what an ``aot_autograd`` backend receives)
dynamo     Dynamo's torch-level graph (what a ``torch.compile`` backend receives)
fx         ``torch.fx.symbolic_trace`` (torch-level, calls and methods as written)
========= ===========================================================================

Tensor parameters become pattern variables named after the parameters. A scalar parameter
(``eps``) becomes a literal wildcard: it matches any literal there and is captured, so one
rule covers every ``eps``. (The functions are traced with a distinctive stand-in value for
each scalar, which must reach an op unchanged.) Export's assertion nodes and unused values
are dropped from the traced pattern. Returned values that other returned values are
computed from (a residual sum) become the rule's extra outputs: their uses outside the
match move to the replacement's corresponding result. Trace with the dtypes of the target
graph: a ``.float()`` on a float32 example leaves no cast in the trace.
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx
from torch.fx import Node
from torch.fx.node import map_aggregate

from ..core.errors import FxpassError
from ..edit.editor import Editor
from ..edit.location import caller_location
from ..fxutil.graph_forms import spelled
from ..fxutil.paths import find_path
from .leaves import Const, Pattern, Var
from .pattern import P
from .rule import GraphReplacement, Rule

__all__ = ["IRS", "Replacement", "TraceError", "pattern_from_graph", "trace", "traced_rule"]

#: the graph forms (:mod:`fxpass.fxutil.graph_forms`) a function can be traced into
IRS = tuple(spelled({f: f for f in ("aten", "export", "aot", "dynamo", "fx")}))

_sentinel_counter = itertools.count()


class TraceError(FxpassError):
    """A pattern or replacement function could not be traced into a usable pattern."""


def _sentinel(value: Any) -> Any:
    """A distinctive stand-in for a scalar argument, recognisable in the traced graph."""
    i = next(_sentinel_counter)
    if isinstance(value, float):
        return 0.000987654321 + i * 1.0e-9
    return 987_654_321 + i


def _params(fn: Callable) -> list[str]:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError) as e:
        raise TraceError(f"cannot read the parameters of {fn!r}: {e}") from None
    names = []
    for p in sig.parameters.values():
        if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            raise TraceError(
                f"{getattr(fn, '__name__', fn)}: traced pattern functions take plain "
                f"positional parameters (not *args/**kwargs/keyword-only '{p.name}')"
            )
        names.append(p.name)
    return names


def _stand_ins(names: list[str], inputs: Sequence[Any]) -> tuple[list[Any], dict[str, Any]]:
    """Example inputs with scalars replaced by sentinels; {param name: sentinel}."""
    args, sentinels = [], {}
    for name, value in zip(names, inputs):
        if isinstance(value, bool) or value is None:
            args.append(value)
        elif isinstance(value, (int, float)):
            s = _sentinel(value)
            sentinels[name] = s
            args.append(s)
        elif isinstance(value, torch.Tensor):
            args.append(value)
        else:
            raise TraceError(
                f"example input for '{name}' must be a tensor or a scalar, "
                f"not {type(value).__name__}"
            )
    return args, sentinels


def _fresh_wrapper(fn: Callable, n: int) -> Callable:
    """A new function object with a new code object calling ``fn`` (Dynamo caches by code)."""
    names = ", ".join(f"a{i}" for i in range(n))
    src = f"def _fxpass_traced({names}):\n    return fn({names})\n"
    env: dict[str, Any] = {"fn": fn}
    exec(compile(src, f"<fxpass trace {next(_sentinel_counter)}>", "exec"), env)
    return env["_fxpass_traced"]


def trace(
    fn: Callable, example_inputs: Sequence[Any], ir: str = "aten"
) -> tuple[fx.GraphModule, dict[Node, str]]:
    """Trace ``fn`` into ``ir``; returns the graph module and {placeholder: parameter}."""
    if ir not in IRS:
        raise ValueError(f"ir must be one of {', '.join(IRS)}, not {ir!r}")
    names = _params(fn)
    if len(names) != len(example_inputs):
        raise TraceError(
            f"{getattr(fn, '__name__', fn)} takes {len(names)} parameters "
            f"({', '.join(names)}) but {len(example_inputs)} example inputs were given"
        )
    args = list(example_inputs)
    try:
        gm, order = _TRACERS[ir](fn, names, args)
    except TraceError:
        raise
    except Exception as e:
        raise TraceError(
            f"tracing {getattr(fn, '__name__', fn)} into ir={ir!r} failed: {type(e).__name__}: {e}"
        ) from e
    mapping = {}
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            name = order(node)
            if name is not None:
                mapping[node] = name
    _drop_dead(gm.graph)
    return gm, mapping


def _by_position(names: list[str]) -> Callable[[Node], str | None]:
    seen: list[Node] = []

    def order(node: Node) -> str | None:
        seen.append(node)
        i = len(seen) - 1
        return names[i] if i < len(names) else None

    return order


def _trace_export(fn, names, args, decompose: bool):
    class _Fn(torch.nn.Module):
        def forward(self, *a):
            return fn(*a)

    ep = torch.export.export(_Fn(), tuple(args))
    if decompose:
        ep = ep.run_decompositions()
    _unlift_constants(ep)
    return ep.graph_module, _by_position(names)


def _unlift_constants(ep: Any) -> None:
    """Make the constants export lifted into inputs (``torch.tensor(2.0)`` in the function)
    ``get_attr`` nodes of the traced module again, so that the placeholders left are the
    function's parameters (a just-traced scratch graph no run watches)."""
    from torch.export.graph_signature import InputKind

    gm, editor = ep.graph_module, Editor(None)
    by_name = {n.name: n for n in gm.graph.find_nodes(op="placeholder")}
    for i, spec in enumerate(ep.graph_signature.input_specs):
        if spec.kind == InputKind.USER_INPUT:
            continue
        ph = by_name[spec.arg.name]
        value = ep.constants.get(spec.target) if spec.target is not None else None
        if value is None:
            value = ep.state_dict.get(spec.target)
        if not isinstance(value, torch.Tensor):
            raise TraceError(
                f"traced functions cannot read {spec.kind.name.lower()} '{spec.target}'; "
                "pass it as a parameter"
            )
        attr, j = f"_tensor_constant{i}", 0
        while hasattr(gm, attr):
            j += 1
            attr = f"_tensor_constant{i}_{j}"
        gm.register_buffer(attr, value, persistent=False)
        with gm.graph.inserting_before(ph):
            node = editor.create(gm.graph, "get_attr", attr, (), {})
        node.meta.update(ph.meta)
        editor.replace_all_uses(ph, node, "trace")


def _trace_aot(fn, names, args):
    from torch._functorch.aot_autograd import aot_function

    graphs: list[fx.GraphModule] = []

    def capture(gm, _inputs):
        graphs.append(gm)
        return gm.forward

    with torch.no_grad():
        aot_function(fn, fw_compiler=capture)(*args)
    return graphs[0], _by_position(names)


def _trace_dynamo(fn, names, args):
    graphs: list[fx.GraphModule] = []

    def capture(gm, _inputs):
        graphs.append(gm)
        return gm.forward

    wrapper = _fresh_wrapper(fn, len(args))
    torch.compile(wrapper, backend=capture, fullgraph=True, dynamic=False)(*args)
    tensor_names = [n for n, a in zip(names, args) if isinstance(a, torch.Tensor)]
    return graphs[0], _by_position(tensor_names)  # Dynamo keeps only tensor inputs


def _trace_fx(fn, names, args):
    concrete = {n: a for n, a in zip(names, args) if not isinstance(a, torch.Tensor)}
    gm = fx.symbolic_trace(fn, concrete_args=concrete)

    def order(node: Node) -> str | None:
        name = str(node.target)
        return name if name in names and name not in concrete else None

    return gm, order


_TRACERS: dict[str, Callable] = {
    "aten": lambda fn, names, args: _trace_export(fn, names, args, True),
    "export": lambda fn, names, args: _trace_export(fn, names, args, False),
    "aot": _trace_aot,
    "dynamo": _trace_dynamo,
    "fx": _trace_fx,
}


def _drop_dead(graph: fx.Graph) -> None:
    """Remove assertion nodes and anything the outputs do not need (from a function just
    traced: a scratch graph no run watches)."""
    editor = Editor(None)
    for node in reversed(list(graph.nodes)):
        computes = node.op in ("call_function", "call_method", "call_module", "get_attr")
        if computes and not node.users:  # export's asserts, values the outputs do not need
            editor.erase(node, "trace")


# ----- graph -> pattern --------------------------------------------------------------------
def pattern_from_graph(
    graph: fx.Graph,
    names: dict[Node, str],
    consts: dict[str, Any] | None = None,
) -> tuple[tuple[Pattern, ...], list[str], list[int]]:
    """The patterns for ``graph``'s returned values.

    Returns ``(roots, outputs, order)``: the root patterns, the names of returned inner
    values (extra rule outputs), and for each rule output (roots, then extra outputs) its
    position in the function's return value.
    """
    consts = consts or {}
    by_value = {(type(v), v): name for name, v in consts.items()}
    const_pats = {name: Const(name, location="") for name in consts}
    memo: dict[Node, Pattern] = {}
    loc = caller_location()

    def literal(a: Any) -> Any:
        if isinstance(a, Node):
            return convert(a)
        if isinstance(a, (list, tuple)):
            return type(a)(literal(x) for x in a)
        try:
            name = by_value.get((type(a), a))
        except TypeError:
            name = None
        return const_pats[name] if name is not None else a

    def convert(node: Node) -> Pattern:
        if node in memo:
            return memo[node]
        if node.op == "placeholder":
            if node not in names:
                raise TraceError(f"placeholder {node.name} is not a parameter of the pattern")
            p: Pattern = Var(names[node], location=loc)
        elif node.op in ("call_function", "call_method"):
            args = [literal(a) for a in node.args]
            kwargs = {k: literal(v) for k, v in node.kwargs.items()}
            p = P(node.target, *args, **kwargs)
            p.location = loc
        else:
            raise TraceError(
                f"traced patterns cannot contain {node.op} nodes ({node.name}: {node.target}); "
                "pass tensors as parameters instead"
            )
        memo[node] = p
        return p

    output = next(n for n in graph.nodes if n.op == "output")
    returned = output.args[0]
    values = list(returned) if isinstance(returned, (list, tuple)) else [returned]
    for v in values:
        if not isinstance(v, Node) or v.op == "placeholder":
            raise TraceError(
                "a traced pattern must return values it computes, not parameters or literals"
            )
    inner = _ancestors_among(values)
    roots_idx = [i for i, v in enumerate(values) if v not in inner]
    inner_idx = [i for i, v in enumerate(values) if v in inner]
    roots = tuple(convert(values[i]) for i in roots_idx)
    outputs = []
    for i in inner_idx:
        p = convert(values[i])
        p.name = p.name or f"output{i}"
        outputs.append(p.name)
    return roots, outputs, roots_idx + inner_idx


def _ancestors_among(values: list[Node]) -> set[Node]:
    """The values among ``values`` that another of them is computed from."""
    targets = set(values)
    found: set[Node] = set()
    for v in values:
        stack = list(v.all_input_nodes)
        seen: set[Node] = set()
        while stack:
            n = stack.pop()
            if n in seen:
                continue
            seen.add(n)
            if n in targets:
                found.add(n)
            stack.extend(n.all_input_nodes)
    return found


# ----- replacement -------------------------------------------------------------------------
class Replacement(GraphReplacement):
    """A traced replacement graph, copied in place of each match.

    Placeholders take the values bound to their parameters, scalar stand-ins take the
    captured literals, and the returned values are reordered to the rule's outputs.
    """

    def __init__(
        self,
        graph: fx.Graph,
        names: dict[Node, str],
        consts: dict[str, Any],
        order: list[int] | None = None,
    ) -> None:
        self.graph = graph
        self.names = names
        self.by_value = {(type(v), v): name for name, v in consts.items()}
        self.order = order
        self.nodes = [n for n in graph.nodes if n.op not in ("placeholder", "output")]
        self.output = next(n for n in graph.nodes if n.op == "output")

    def _constant(self, n: Node) -> torch.Tensor | None:
        """The tensor a ``get_attr`` node of the replacement reads, else None."""
        if n.op != "get_attr" or self.graph.owning_module is None:
            return None
        value = find_path(self.graph.owning_module, str(n.target))
        return value if isinstance(value, torch.Tensor) else None

    def write(self, match: Any, bindings: dict[str, Any], editor: Editor) -> Any:
        from .rewriter import _unwrap, constant_node

        graph = match.graph
        env: dict[Node, Any] = {}
        for ph, name in self.names.items():
            if name not in bindings:
                raise TraceError(f"the replacement uses '{name}', which the pattern does not bind")
            env[ph] = _unwrap(bindings[name])
        by_value = self.by_value

        def arg(a: Any) -> Any:
            if isinstance(a, Node):
                return env[a]
            try:
                name = by_value.get((type(a), a))
            except TypeError:
                return a
            return bindings[name] if name is not None else a

        for n in self.nodes:
            value = self._constant(n)
            if value is not None:  # the replacement's own constant, not the graph's namesake
                env[n] = constant_node(graph, value, editor)
                continue
            env[n] = editor.create(
                graph, n.op, n.target, map_aggregate(n.args, arg), map_aggregate(n.kwargs, arg)
            )
        result = map_aggregate(self.output.args[0], arg)
        if isinstance(result, (list, tuple)):
            result = list(result)
            if self.order is not None:
                result = [result[i] for i in self.order]
            return tuple(result) if len(result) > 1 else result[0]
        return result


def traced_rule(
    pattern: Callable,
    replacement: Callable,
    example_inputs: Sequence[Any],
    *,
    ir: str = "aten",
    name: str | None = None,
    where: Callable[..., bool] | None = None,
    trace_replacement: bool = True,
    **rule_options: Any,
) -> Rule:
    """A :class:`Rule` from a pattern function and a replacement function (see the module
    docstring). With ``trace_replacement=False`` the replacement is called with graph
    values for every match instead (it may then call ops directly, in any dialect)."""
    location = caller_location()
    params = _params(pattern)
    args, sentinels = _stand_ins(params, example_inputs)
    gm, names = trace(pattern, args, ir)
    found = _literals(gm.graph)
    missing = [p for p, s in sentinels.items() if (type(s), s) not in found]
    if missing:
        raise TraceError(
            f"scalar parameter(s) {', '.join(missing)} of {pattern.__name__} do not reach an "
            "op unchanged in the traced pattern, so they cannot be captured; use them "
            "directly as op arguments, or write the pattern with P(...)"
        )
    roots, outputs, order = pattern_from_graph(gm.graph, names, sentinels)
    if trace_replacement:
        rparams = _params(replacement)
        if rparams != params:
            raise TraceError(
                f"the replacement's parameters ({', '.join(rparams)}) must be the pattern's "
                f"({', '.join(params)})"
            )
        rgm, rnames = trace(replacement, args, ir)
        rep: Any = Replacement(rgm.graph, rnames, sentinels, order)
    else:
        rep = _reordered(replacement, order)
    return Rule(
        roots if len(roots) > 1 else roots[0],
        rep,
        name=name or getattr(replacement, "__name__", None),
        outputs=outputs,
        where=where,
        location=location,
        **rule_options,
    )


def _literals(graph: fx.Graph) -> set[tuple[type, Any]]:
    out: set[tuple[type, Any]] = set()

    def visit(a: Any) -> Any:
        if not isinstance(a, Node):
            with contextlib.suppress(TypeError):
                out.add((type(a), a))
        return a

    for n in graph.nodes:
        map_aggregate(n.args, visit)
        map_aggregate(n.kwargs, visit)
    return out


def _reordered(fn: Callable, order: list[int]) -> Callable:
    if order == sorted(order):
        return fn

    def replace(**kwargs: Any) -> Any:
        result = fn(**kwargs)
        if result is None:
            return None
        return tuple(result[i] for i in order)

    replace.__name__ = getattr(fn, "__name__", "replacement")
    replace.__signature__ = inspect.signature(fn)  # type: ignore[attr-defined]
    return replace
