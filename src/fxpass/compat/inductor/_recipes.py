"""What a replacement traced once can stand for: per input signature, traced once.

Inductor re-traces the search function and the replacement for every match, with the
matched values, to check the literals its first pattern ignored (sizes, dtypes, ``eps``)
and to build the replacement. A :class:`Variant` is that re-trace done once, with symbolic
sizes, for every match whose inputs have the same dtypes, devices, ranks and 0/1 sizes
(a *signature*): its specific pattern checks the size-derived values of each match by
computing them from the match's sizes, its replacement is replayed with them. A match whose
sizes break what the trace assumed (its guards) gets a static variant of its own sizes,
as Inductor's re-trace would give it.

``replace_by_example`` (handlers of ``register_graph_pattern``) uses the same machinery:
:func:`example_replay` traces a replacement function once per signature.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import sympy
import torch
import torch.utils._pytree as pytree
from torch import fx
from torch.fx import Node

from ._exprs import CallFunction, Ignored, MultiOutputPattern, PatternExpr, SizeExpr
from ._replay import Plan, Replay, apply_replay
from ._signatures import signature, static_signature
from ._trace import (
    IGNORED_TYPES,
    SymbolicTrace,
    fwd_only,
    graph_to_pattern,
    size_of,
    trace_symbolic,
)

__all__ = [
    "ArgInfo",
    "ReplacementRecipe",
    "Variant",
    "example_replay",
    "replace_by_example",
    "signature",
]

log = logging.getLogger(__name__)


# ----- the arguments of a search function ---------------------------------------------------
@dataclass(frozen=True)
class ArgInfo:
    """The search function's parameters, flattened as pytrees: ``flat_names`` (``x``, or
    ``xs_0, xs_1`` for a list), per parameter its ``specs`` and flat names."""

    argnames: list[str]
    flat_names: list[str]
    specs: dict[str, Any]
    names_of: dict[str, list[str]]

    @staticmethod
    def of(argnames: Sequence[str], args: Sequence[Any]) -> ArgInfo:
        flat: list[str] = []
        specs: dict[str, Any] = {}
        names_of: dict[str, list[str]] = {}
        used: set[str] = set()
        for name, arg in zip(argnames, args):
            leaves, spec = pytree.tree_flatten(arg)
            specs[name] = spec
            if len(leaves) == 1:
                names = [_unique(name, used)]
            else:
                names = [_unique(f"{name}_{i}", used) for i in range(len(leaves))]
            names_of[name] = names
            flat.extend(names)
        return ArgInfo(list(argnames), flat, specs, names_of)

    def structure(self, flat: Sequence[Any]) -> list[Any]:
        """Flat values -> one value (a pytree) per parameter."""
        out, i = [], 0
        for name in self.argnames:
            n = len(self.names_of[name])
            out.append(pytree.tree_unflatten(list(flat[i : i + n]), self.specs[name]))
            i += n
        return out

    def unflatten(
        self, kwargs: dict[str, Any], defaults: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Match keywords by flat name -> by parameter (``defaults`` for missing ones)."""
        kwargs = dict(kwargs)
        out: dict[str, Any] = {}
        for name in self.argnames:
            names = self.names_of[name]
            if names == [name] and name in kwargs and self.specs[name].is_leaf():
                out[name] = kwargs.pop(name)  # one tensor: nothing to rebuild
                continue
            found = [n for n in names if n in kwargs]
            if len(found) != len(names):
                if defaults is not None and name in defaults and not found:
                    out[name] = defaults[name]
                    continue
                missing = [n for n in names if n not in kwargs]
                raise RuntimeError(
                    f"Not all inputs to pattern found in match.kwargs. Perhaps one of the "
                    f"inputs is unused? argname={name}, flat_argnames={names}, "
                    f"missing_argnames={missing}, match.kwargs={kwargs}"
                )
            out[name] = pytree.tree_unflatten([kwargs.pop(n) for n in names], self.specs[name])
        out.update(kwargs)
        return out


def _unique(name: str, used: set[str]) -> str:
    out, i = name, 0
    while out in used:
        out = f"{name}_{i}"
        i += 1
    used.add(out)
    return out


def value_of(x: Any) -> Any:
    """A matched value's example: a node's ``meta['val']`` (or Dynamo's example value)."""
    if isinstance(x, Node):
        meta = x.meta
        if "val" in meta:
            return meta["val"]
        if "example_value" in meta:
            return meta["example_value"]
        raise LookupError(
            f"%{x.name} has no meta['val']: register_replacement checks matches against the "
            "matched values (run FakeTensorProp on the graph first)"
        )
    return x


# ----- guards -------------------------------------------------------------------------------
@dataclass
class Guards:
    """What a symbolic trace assumed about the sizes: holds for given values?"""

    exprs: list[Any]
    symbols: dict[Any, tuple[int, str, int]]
    cache: dict[tuple, bool] = field(default_factory=dict)

    @staticmethod
    def of(trace: SymbolicTrace) -> Guards:
        return Guards(list(trace.guards), dict(trace.symbols))

    def hold(self, values: Sequence[Any]) -> bool:
        if not self.exprs:
            return True
        sub = {}
        for sym, (i, kind, d) in self.symbols.items():
            try:
                v = size_of(values[i], kind, d)
            except (LookupError, IndexError):
                return True
            if not isinstance(v, int):
                return True  # symbolic sizes: the graph's own guards decide
            sub[sym] = sympy.Integer(v)
        key = tuple(sub.values())
        hit = self.cache.get(key)
        if hit is None:
            hit = self.cache[key] = all(_holds(g, sub) for g in self.exprs)
        return hit


def _holds(guard: Any, sub: dict[Any, Any]) -> bool:
    try:
        result = guard.xreplace(sub)
    except Exception:  # broad: a guard that cannot be evaluated does not hold: the variant
        return False  # traced for these very sizes (which needs no guard) is used instead
    return result is not sympy.false and result != sympy.false


# ----- register_replacement's traces ------------------------------------------------------
@dataclass
class Variant:
    """The specific pattern and the replacement for one signature (see the module docstring)."""

    specific: PatternExpr | None
    #: the replacement's trace; None until first read when ``make`` traces it (a match
    #: whose check fails never needs it: Inductor traces a replacement only for a match
    #: that passed)
    traced: SymbolicTrace | None
    guards: list[Guards]
    plan: Plan | None = None
    #: when the registered pattern comes from this variant's trace: per op expression of
    #: it, the arguments it ignores and what the specific pattern wants there (checking
    #: them is the specific match, without matching again)
    slots: list[tuple[Any, list[tuple[int, Any]]]] | None = None
    make: Callable[[], SymbolicTrace] | None = None
    #: a trace of the first sizes made in the graph's own fake mode: the values it was
    #: traced with (a replay on exactly these takes the trace's values, as Inductor's
    #: replacement nodes do, instead of computing them again)
    inputs: list[Any] | None = None

    @property
    def replacement(self) -> SymbolicTrace:
        if self.traced is None:
            assert self.make is not None, "a variant without a replacement"
            self.traced, self.make = self.make(), None
        return self.traced

    def replay(self, args: Sequence[Any], literals: dict[Any, Any]) -> Replay:
        if self.plan is None:
            self.plan = Plan(self.replacement.gm)
        traced_on = self.inputs is not None and _same_values(args, self.inputs)
        return Replay(
            self.replacement.gm,
            args,
            self.replacement.sources,
            literals,
            self.plan,
            traced_on=traced_on,
        )


def _same_values(args: Sequence[Any], inputs: Sequence[Any]) -> bool:
    """Whether ``args``' values are ``inputs`` themselves (the same objects: a graph's fake
    values, so the same fake mode, sizes and storages)."""
    if len(args) != len(inputs):
        return False
    for a, v in zip(args, inputs):
        try:
            if value_of(a) is not v:
                return False
        except LookupError:
            return False
    return True


class ReplacementRecipe:
    """``register_replacement``'s functions, traced: the pattern to register (sizes and
    ignored literal types blind, as Inductor's) and a :class:`Variant` per signature."""

    def __init__(
        self,
        search_fn: Callable[..., Any],
        replace_fn: Callable[..., Any],
        example_inputs: Sequence[Any],
        trace_fn: Callable[..., Any],
        scalar_workaround: dict[str, float | int],
        exclusive_arg_names: Sequence[str],
        search_fn_pattern: PatternExpr | None,
        get_decomp_fn: Callable[..., Any] | None,
    ) -> None:
        self.search_fn = search_fn
        self.replace_fn = replace_fn
        self.trace_fn = trace_fn
        self.workaround = scalar_workaround
        self.exclusive = tuple(exclusive_arg_names)
        self.given_pattern = search_fn_pattern
        self.get_decomp_fn = get_decomp_fn
        self.argnames = list(inspect.signature(search_fn).parameters)
        inputs = _initial_inputs(self.argnames, example_inputs, scalar_workaround)
        self.info = ArgInfo.of(self.argnames, inputs)
        self.flat_inputs = pytree.tree_leaves(inputs)
        self.requires_grad = [
            isinstance(x, torch.Tensor) and x.requires_grad for x in self.flat_inputs
        ]
        self.literals = {(type(v), v): k for k, v in scalar_workaround.items()}
        self.variants: dict[tuple, Variant | None] = {}
        self.search_gm: fx.GraphModule | None = None
        self._blind: PatternExpr | None = None
        #: per signature, the first exact sizes seen (traced statically, see variant_for)
        self._first_sizes: dict[tuple, tuple] = {}
        self.pattern = search_fn_pattern or self._first_pattern()

    def _trace(self, fn: Callable[..., Any], args: list[Any]) -> fx.GraphModule:
        if self.get_decomp_fn is None:
            return self.trace_fn(fn, args)
        return self.trace_fn(fn, args, get_decomp_fn=self.get_decomp_fn)

    def grads_ok(self, values: Sequence[Any]) -> bool:
        """Whether the match's values can be traced as the examples were: no integer
        tensor where an example required grad (Inductor's check rejects those)."""
        return not any(
            grad
            and isinstance(v, torch.Tensor)
            and not (v.dtype.is_floating_point or v.dtype.is_complex)
            for v, grad in zip(values, self.requires_grad)
        )

    def _with_grads(self, values: Sequence[Any]) -> list[Any]:
        """The values as the functions are traced with them: requiring grad where the
        example inputs did."""
        out = []
        for v, grad in zip(values, self.requires_grad):
            if isinstance(v, torch.Tensor) and v.requires_grad != grad:
                v = v.detach().requires_grad_(grad)
            out.append(v)
        return out

    def _first_pattern(self) -> PatternExpr:
        """The pattern to register: the search function traced with the example inputs, as
        Inductor traces it (sizes and ignored literal types blind). The symbolic traces that
        check and replace matches wait for the first match (:meth:`variant_for`), so
        registering costs what Inductor's does and patterns that never match cost no more."""
        gm = self._trace(self.search_fn, self.info.structure(self.flat_inputs))
        self.search_gm = gm
        self._blind = graph_to_pattern(
            gm,
            argnames=self.info.flat_names,
            ignore_types=IGNORED_TYPES,
            scalar_workaround=self.workaround,
            exclusive_arg_names=self.exclusive,
        )
        return self._blind

    def _variant(self, inputs: Sequence[Any]) -> Variant:
        """Trace the search and replacement functions with symbolic sizes (``inputs`` give
        dtypes, devices, ranks and the sizes the trace starts from)."""
        guards: list[Guards] = []
        specific = slots = None
        if self.given_pattern is None:
            search = trace_symbolic(self._trace, self.search_fn, self.info.structure(inputs))
            common = {
                "argnames": self.info.flat_names,
                "scalar_workaround": self.workaround,
                "exclusive_arg_names": self.exclusive,
                "sources": search.sources,
            }
            specific = graph_to_pattern(search.gm, **common)
            guards.append(Guards.of(search))
            if self._blind is not None:  # the registered pattern: checked by its slots
                slots = literal_slots(self._blind, specific)
        replacement = trace_symbolic(self._trace, self.replace_fn, self.info.structure(inputs))
        guards.append(Guards.of(replacement))
        return Variant(specific, replacement, guards, slots=slots)

    def _static_variant(self, values: Sequence[Any]) -> Variant:
        """A trace of the match's own sizes (its sizes broke a symbolic trace's guards)."""
        from torch._guards import detect_fake_mode
        from torch._subclasses.fake_tensor import FakeTensorMode

        mode = detect_fake_mode(values)
        inputs = None
        if mode is not None:  # traced with the values themselves, in their graph's fake
            flat = inputs = list(values)  # mode (as Inductor traces a match)
        else:
            mode = FakeTensorMode()
            flat = [mode.from_tensor(v) if isinstance(v, torch.Tensor) else v for v in values]
        args = self.info.structure(flat)
        with mode:
            specific = None
            if self.given_pattern is None:
                gm = self._trace(self.search_fn, args)
                specific = graph_to_pattern(
                    gm,
                    argnames=self.info.flat_names,
                    scalar_workaround=self.workaround,
                    exclusive_arg_names=self.exclusive,
                )

        def replacement() -> SymbolicTrace:  # when a match of these sizes first passes
            with mode:
                return SymbolicTrace(self._trace(self.replace_fn, args), [])

        slots = None
        if specific is not None and self._blind is not None:
            slots = literal_slots(self._blind, specific)
        return Variant(specific, None, [], slots=slots, make=replacement, inputs=inputs)

    def variant_for(self, values: Sequence[Any]) -> Variant | None:
        """The variant for a match's flat input values (tensors: their ``meta['val']``,
        see :meth:`grads_ok`); None when its sizes cannot be traced."""
        key = signature(values, self.requires_grad)
        v = self.variants.get(key, ...)
        exact = static_signature(values, exact=True)
        if v is ... and exact is not None and self._first_sizes.setdefault(key, exact) == exact:
            # the first sizes of a signature: traced with them, as Inductor traces a match
            # (cheaper than symbolic sizes, reused by every match of the same sizes; other
            # sizes of the signature then get the symbolic trace)
            return self._static_for(exact, values)
        if v is ...:
            try:
                v = self._variant(self._with_grads(values))
            except Exception as e:
                log.info("tracing %s for %s failed: %s", self.search_fn.__name__, key, e)
                v = None
            self.variants[key] = v
        if v is not None and all(g.hold(values) for g in v.guards):
            return v
        static = static_signature(values)
        if static is None:
            return None
        return self._static_for(static, values)

    def _static_for(self, static: tuple, values: Sequence[Any]) -> Variant | None:
        """The variant traced with these exact sizes (``static``: their static signature)."""
        key = ("static", static)
        v = self.variants.get(key, ...)
        if v is ...:
            try:
                v = self.variants[key] = self._static_variant(self._with_grads(values))
            except Exception as e:
                log.info("tracing %s for %s failed: %s", self.search_fn.__name__, static, e)
                v = self.variants[key] = None
        return v


def literal_slots(blind: PatternExpr, specific: PatternExpr) -> list | None:
    """Pair the registered (size-blind) pattern with the specific one traced from the same
    graph: for each op expression of the blind one, (argument index, what the specific one
    has there) where the blind one ignores it. None if the two do not line up."""
    out: list[tuple[Any, list[tuple[int, Any]]]] = []
    seen: set[int] = set()

    def pair(b: Any, s: Any) -> bool:
        if id(b) in seen:
            return True
        seen.add(id(b))
        if isinstance(b, MultiOutputPattern):
            return (
                isinstance(s, MultiOutputPattern)
                and len(b.outputs) == len(s.outputs)
                and all(x is None or pair(x, y) for x, y in zip(b.outputs, s.outputs))
            )
        if not isinstance(b, CallFunction):
            return type(b) is type(s)
        if not isinstance(s, CallFunction) or b.fns != s.fns or list(b.kwargs) != list(s.kwargs):
            return False
        mine, theirs = [*b.args, *b.kwargs.values()], [*s.args, *s.kwargs.values()]
        if len(mine) != len(theirs):
            return False
        checks = []
        for i, (x, y) in enumerate(zip(mine, theirs)):
            if isinstance(x, Ignored) and not isinstance(y, Ignored):
                checks.append((i, y))
            elif isinstance(x, PatternExpr):
                if not pair(x, y):
                    return False
            elif _has_expr(x) or x != y:
                return False
        if checks:
            out.append((b, checks))
        return True

    return out if pair(blind, specific) else None


def _has_expr(x: Any) -> bool:
    if isinstance(x, (list, tuple)):
        return any(_has_expr(v) for v in x)
    return isinstance(x, PatternExpr)


def wanted(expected: Any, env: dict[str, Any]) -> Any:
    """A slot's expected value for a match: literals as they are, sizes computed."""
    if isinstance(expected, SizeExpr):
        return expected.fn(env)
    if isinstance(expected, (list, tuple)):
        return type(expected)(wanted(x, env) for x in expected)
    return expected


def _initial_inputs(
    argnames: list[str], inputs: Sequence[Any], workaround: dict[str, Any]
) -> list[Any]:
    out, i = [], 0
    for name in argnames:
        if name in workaround:
            out.append(workaround[name])
        else:
            if i >= len(inputs):
                raise TypeError(
                    f"register_replacement: the search function takes {argnames} but only "
                    f"{len(inputs)} example inputs were given (and scalar_workaround names "
                    f"{sorted(workaround)})"
                )
            out.append(inputs[i])
            i += 1
    return out


# ----- replace_by_example ------------------------------------------------------------------
_EXAMPLES: dict[tuple, tuple[Any, Variant | None]] = {}


def _fn_key(fn: Any) -> Any:
    """Functions that trace alike: the same code, defaults and captured values."""
    if isinstance(fn, functools.partial):
        return ("partial", _fn_key(fn.func), fn.args, tuple(sorted(fn.keywords.items())))
    code = getattr(fn, "__code__", None)
    if code is None:
        return ("id", id(fn))
    cells = tuple(c.cell_contents for c in (fn.__closure__ or ()))
    key = ("code", code, fn.__defaults__, cells, getattr(fn, "__self__", None))
    try:
        hash(key)
    except TypeError:
        return ("id", id(fn))
    return key


def example_replay(
    fn: Callable[..., Any],
    args: list[Any],
    trace_fn: Callable[..., Any] | None,
    run_functional_passes: bool,
) -> Replay:
    """A :class:`Replay` of ``fn`` traced for ``args``' signature (once per signature)."""
    values = [value_of(a) for a in args]
    trace = trace_fn or functools.partial(fwd_only, run_functional_passes=run_functional_passes)
    fkey = _fn_key(fn)
    base = (fkey, _fn_key(trace_fn) if trace_fn is not None else None, run_functional_passes)
    sig = signature(values)
    exact = static_signature(values, exact=True)
    if exact is not None and _FIRST_SIZES.setdefault((*base, sig), exact) == exact:
        # the first sizes of a signature: traced with the values, as Inductor traces them
        # (reused by every match of the same sizes; other sizes share a symbolic trace)
        variant = _cached((*base, "static", exact), fn, fkey, lambda: _static(trace, fn, values))
        return variant.replay(args, {})
    variant = _cached((*base, sig), fn, fkey, lambda: _symbolic(trace, fn, values))
    if variant is not None and all(g.hold(values) for g in variant.guards):
        return variant.replay(args, {})
    static = static_signature(values)
    if static is None:
        raise RuntimeError(f"cannot trace {fn!r} for these (symbolic) values")
    variant = _cached((*base, "static", static), fn, fkey, lambda: _static(trace, fn, values))
    return variant.replay(args, {})


#: per (function, trace, signature), the first exact sizes replayed (see example_replay)
_FIRST_SIZES: dict[tuple, tuple] = {}


def _cached(key: tuple, fn: Any, fkey: Any, make: Callable[[], Variant | None]) -> Variant | None:
    hit = _EXAMPLES.get(key)
    if hit is None or (fkey[0] == "id" and hit[0] is not fn):  # an id may be reused
        if len(_EXAMPLES) > 1024:
            _EXAMPLES.clear()
            _FIRST_SIZES.clear()
        hit = _EXAMPLES[key] = (fn, make())
    return hit[1]


def _symbolic(
    trace: Callable[..., Any], fn: Callable[..., Any], values: list[Any]
) -> Variant | None:
    try:
        replacement = trace_symbolic(trace, fn, values)
    except Exception as e:
        log.info("tracing %s with symbolic sizes failed (%s); tracing it per size", fn, e)
        return None
    return Variant(None, replacement, [Guards.of(replacement)])


def _static(trace: Callable[..., Any], fn: Callable[..., Any], values: list[Any]) -> Variant:
    from torch._guards import detect_fake_mode
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = detect_fake_mode(values)
    inputs = None
    if mode is not None:  # the graph's values in its own fake mode, as Inductor traces them
        fakes = inputs = list(values)
    else:
        mode = FakeTensorMode()
        fakes = [mode.from_tensor(v) if isinstance(v, torch.Tensor) else v for v in values]
    with mode:
        gm = trace(fn, fakes)
    return Variant(None, SymbolicTrace(gm, []), [], inputs=inputs)


def replace_by_example(
    match: Any,
    replacement_fn: Callable[..., Any],
    args: Sequence[Any],
    trace_fn: Callable[..., Any] | None,
    run_functional_passes: bool,
) -> list[Node]:
    """``Match.replace_by_example``: ``replacement_fn`` traced (once per signature, see
    :mod:`._recipes`) in place of the match."""
    name = (
        match.run.entry_name
        if match.run is not None
        else getattr(replacement_fn, "__name__", "replace_by_example")
    )
    replay = example_replay(replacement_fn, list(args), trace_fn, run_functional_passes)
    return apply_replay(match, replay, name)
