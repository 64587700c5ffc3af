"""``register_replacement``: a search function and a replacement function, traced once.

>>> def search(x, w):
...     return rms_norm_by_hand(x, w)
>>> def replace(x, w):
...     return torch.ops.my.rms_norm(x, w, 1e-6)
>>> register_replacement(search, replace, [x_example, w_example], fwd_only, pm_pass)  # doctest: +SKIP

The search function becomes the pattern Inductor would register (sizes, dtypes and other
literals a trace bakes in are ignored by it), and each match is then checked as Inductor
checks it — the literals it ignored must be what the search function gives for the matched
values (its ``eps``, its dtypes; its sizes, computed from the matched sizes), and the
``extra_check`` must hold — but from one trace with symbolic sizes per input signature
(:mod:`._recipes`), not a trace per match. The replacement is replayed with the match's
sizes (:mod:`._replay`).
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import fx
from torch.fx import Node
from torch.fx.experimental.symbolic_shapes import guard_or_false

from ...rewrite import Replace
from ...rewrite.match import MatchState
from ...rewrite.region import lazy_order
from ._compile import FunctionalizedV2, argument_values
from ._entry import (
    PatternEntry,
    _return_true,
    as_list,
    check_and_add_duplicate_pattern,
    debug_node,
    explain_failure,
    find,
    log,
)
from ._exprs import FailedMatch, PatternExpr
from ._match import Match
from ._matching import dependent_values, same_size
from ._pass import PatternMatcherPass
from ._recipes import ReplacementRecipe, value_of, wanted
from ._replay import Replay, apply_replay, replay_edit
from ._trace import IGNORED_TYPES, graph_to_pattern

__all__ = [
    "ReplacementPatternEntry",
    "gen_pattern",
    "gen_pattern_and_search_gm",
    "gen_register_replacement",
    "register_replacement",
]


@dataclasses.dataclass
class ReplacementPatternEntry(PatternEntry):
    """A pattern replaced by a traced replacement (see the module docstring)."""

    normalize_args: Callable[..., list[Any]]
    pattern_name: str | None = None
    recipe: Any = dataclasses.field(default=None, repr=False)
    check: Callable[[Match, bool], Any] | None = dataclasses.field(default=None, repr=False)

    @property
    def entry_name(self) -> str:
        if self.pattern_name:
            return self.pattern_name
        fn = getattr(self.recipe, "replace_fn", None)
        return getattr(fn, "__name__", "replacement")

    def apply(self, match: Match, graph: fx.Graph, node: Node) -> None:
        apply_replay(match, self._replay(match), self.entry_name)

    def edit(self, match: Match, graph: fx.Graph, node: Node) -> Replace:
        """How a pass run applies ``match``: the recorded replacement, replayed by the
        rewrite driver."""
        return replay_edit(match, self._replay(match), self.entry_name)

    def _replay(self, match: Match) -> Replay:
        replay = match.replay
        if replay is None:  # a match checked elsewhere, with a replacement graph
            if match.replacement_graph is None:
                raise RuntimeError("apply: the match was not checked (no replacement graph)")
            replay = Replay(
                match.replacement_graph, self.normalize_args(*match.args, **match.kwargs)
            )
        return replay

    @staticmethod
    def replace_with_graph(
        match: Match,
        graph: fx.Graph,
        replacement_graph: Any,
        args: Sequence[Any],
        pass_name: str | None = None,
    ) -> list[Node]:
        return apply_replay(
            match, Replay(replacement_graph, args), pass_name or "replace_with_graph"
        )

    def explain_check(self, match: Match) -> str | None:
        """Why the check of a match fails (None: it holds)."""
        if self.check is None:
            return None if self.extra_check(match) else "extra_check returned False"
        return self.check(match, True)


def _acyclic(found: Any, variant: Any, flat: list[Any]) -> bool:
    """Whether the replacement reads (or returns) none of the bound values computed from the
    match's own nodes (:func:`dependent_values`): replacing would form a cycle otherwise."""
    dependent = dependent_values(found)
    if not dependent:
        return True
    phs = variant.replacement.gm.graph.find_nodes(op="placeholder")
    phs = phs[len(phs) - len(flat) :]  # after the size symbols
    return not any(v in dependent and ph.users for ph, v in zip(phs, flat))


def _replacement_traces(variant: Any) -> bool:
    """Whether the variant's replacement traces (its trace waits for the first match that
    passes the check); one that cannot be traced for these sizes is no match, as before."""
    try:
        variant.replacement  # noqa: B018  (traces it, once)
    except Exception as e:  # broad: whatever the trace raises, the match is refused
        log.info("tracing the replacement failed: %s", e)
        return False
    return True


def _slots_hold(slots: list, match: Match) -> bool:
    """The specific pattern's literals and sizes at the arguments the registered pattern
    ignored, checked on the match's own nodes (same trace, same structure)."""
    env = match.found.bindings
    p2n = match.ctx.pattern_to_node
    for expr, checks in slots:
        node = p2n.get(expr)
        if node is None:
            return False
        if node.target is torch.ops.higher_order.auto_functionalized_v2:  # an improvement
            vals = FunctionalizedV2(expr, None, expr.args[0]).values(node)
        else:
            vals = argument_values(node, len(expr.args), tuple(expr.kwargs))
        if vals is None:
            return False
        for i, expected in checks:
            try:
                want = wanted(expected, env)
            except Exception:  # broad: a size that cannot be computed here cannot be checked: no
                return False
            if not same_size(vals[i], want):
                return False
    return True


def _wrap_bound_method(fn: Any, argnames: list[str]) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    wrapper.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in argnames]
    )
    wrapper.__name__ = getattr(fn, "__name__", "bound_method")
    return wrapper


def _is_joint(trace_fn: Any) -> bool:
    return getattr(trace_fn, "__name__", "") == "joint_fwd_bwd"


def register_replacement(
    search_fn: Callable[..., Any],
    replace_fn: Callable[..., Any],
    example_inputs: Sequence[Any],
    trace_fn: Callable[..., Any],
    pass_dicts: Any,
    extra_check: Callable[[Match], Any] = _return_true,
    scalar_workaround: dict[str, float | int] | None = None,
    exclusive_arg_names: Sequence[str] = (),
    search_fn_pattern: PatternExpr | None = None,
    skip_duplicates: bool = False,
    pattern_name: str | None = None,
    get_decomp_fn: Callable[..., Any] | None = None,
) -> Any:
    """Replace every match of ``search_fn`` by ``replace_fn`` when ``pass_dicts`` (a
    :class:`PatternMatcherPass` or a list of them) is applied. Both are traced by
    ``trace_fn`` (``fwd_only``, ``joint_fwd_bwd``) with ``example_inputs``; ``extra_check``
    sees each match (its ``kwargs`` keyed by the search function's parameters). Returns the
    registered pattern, or False for a skipped duplicate (as Inductor)."""
    argnames = list(inspect.signature(search_fn).parameters)
    if inspect.ismethod(search_fn):
        search_fn = _wrap_bound_method(search_fn, argnames)
    if inspect.ismethod(replace_fn):
        replace_fn = _wrap_bound_method(replace_fn, list(inspect.signature(replace_fn).parameters))
    if not isinstance(example_inputs, (list, tuple)):
        raise TypeError(f"example_inputs must be a list or tuple, got {type(example_inputs)}")
    if not callable(trace_fn):
        raise TypeError(f"trace_fn must be fwd_only, joint_fwd_bwd or a tracer, got {trace_fn!r}")
    if _is_joint(trace_fn) and torch.is_inference_mode_enabled():
        return False
    from torch._functorch import config as functorch_config

    with functorch_config.patch(functionalize_rng_ops=False):
        recipe = ReplacementRecipe(
            search_fn,
            replace_fn,
            example_inputs,
            trace_fn,
            dict(scalar_workaround or {}),
            exclusive_arg_names,
            search_fn_pattern,
            get_decomp_fn,
        )
    pattern = recipe.pattern
    graph = (
        recipe.search_gm.graph
        if recipe.search_gm is not None and search_fn_pattern is None
        else None
    )
    for p in as_list(pass_dicts):
        if isinstance(p, PatternMatcherPass) and check_and_add_duplicate_pattern(
            pattern, graph, p.seen_patterns, skip_duplicates=skip_duplicates
        ):
            return False
    info = recipe.info

    def normalize_args(*args: Any, **kwargs: Any) -> list[Any]:
        if not all(name in kwargs for name in argnames):
            kwargs = info.unflatten(kwargs)
        flat = []
        for name in argnames:
            value = kwargs.pop(name)
            if isinstance(value, Node):  # most arguments: one graph value
                flat.append(value)
            else:
                flat.extend(pytree.tree_leaves(value))
        i = 1
        while f"tangents_{i}" in kwargs:
            flat.append(kwargs.pop(f"tangents_{i}"))
            i += 1
        if kwargs:
            raise RuntimeError(f"leftover kwargs: {kwargs!r}")
        return flat

    def check(match: Match, explaining: bool = False) -> Any:
        """Inductor's check of a match, from the traced variant for its signature; with
        ``explaining``, why it fails (None if it holds)."""

        def no(why: str) -> Any:
            return why if explaining else False

        structured = info.unflatten(match.kwargs)
        flat = normalize_args(**structured)
        values = [value_of(x) for x in flat]
        if not recipe.grads_ok(values):
            return no("an integer input would have to require grad")
        variant = recipe.variant_for(values)
        if variant is None:
            return no("the search function cannot be traced for these inputs")
        node = match.output_nodes()[0]
        if variant.slots is not None and not explaining and not debug_node(node.name):
            if not _slots_hold(variant.slots, match):
                return False
            match.kwargs = structured
            if not guard_or_false(extra_check(match)):
                return False
            return accept(match, variant, structured)
        specific = variant.specific if variant.specific is not None else recipe.given_pattern
        st = match.run.state if match.run is not None else MatchState(order=lazy_order(node.graph))
        found = find(specific, node, st, match.extra)
        if debug_node(node.name):
            shown = found or FailedMatch("{}", explain_failure(specific, node, match.extra))
            log.warning("Specific pattern match: %s%s %s %s", node, node.args, shown, specific)
        if found is None:
            if explaining:
                why = explain_failure(specific, node, match.extra)
                return f"{why} (the search function traced for the matched values)"
            return False
        found.kwargs = info.unflatten(found.kwargs, defaults=structured)
        found.run = match.run
        if not guard_or_false(extra_check(found)):
            return no("extra_check returned False")
        if explaining:
            if not _replacement_traces(variant):
                return "the replacement function cannot be traced for these inputs"
            if match.found is not None and not _acyclic(match.found, variant, flat):
                return "cycle: the replacement reads a value computed from the match's nodes"
            return None
        return accept(match, variant, structured)

    def accept(match: Match, variant: Any, structured: dict[str, Any]) -> bool:
        if not _replacement_traces(variant):
            return False
        literals = {key: (structured[name],) for key, name in recipe.literals.items()}
        flat = normalize_args(**structured)
        if match.found is not None and not _acyclic(match.found, variant, flat):
            return False
        match.replay = variant.replay(flat, literals)
        match.replacement_graph = variant.replacement.gm
        match.kwargs = structured
        return True

    entry = ReplacementPatternEntry(
        pattern=pattern,
        extra_check=check,
        normalize_args=normalize_args,
        pattern_name=pattern_name,
        recipe=recipe,
        check=check,
    )
    entry.register(pass_dicts)
    return pattern


#: (search_fn, example_inputs, trace_fn, scalar_workaround, pattern) of every
#: gen_register_replacement, as Inductor keeps them.
_known_precompiled_patterns: list[tuple[Any, ...]] = []


def gen_register_replacement(
    unique_name: str,
    search_fn: Callable[..., Any],
    replace_fn: Callable[..., Any],
    example_inputs: Sequence[Any],
    trace_fn: Callable[..., Any],
    pass_dicts: Any,
    extra_check: Callable[[Match], Any] = _return_true,
    scalar_workaround: dict[str, float | int] | None = None,
    exclusive_arg_names: Sequence[str] = (),
    skip_duplicates: bool = False,
    get_decomp_fn: Callable[..., Any] | None = None,
) -> None:
    """Inductor's precompiled registration: Inductor loads the search pattern serialized
    under ``unique_name``; here it is traced (once, as every pattern is), so the result is
    the same without a generated file (``PYTORCH_GEN_PATTERNS`` writes none)."""
    example_inputs = tuple(example_inputs)
    pattern = register_replacement(
        search_fn,
        replace_fn,
        example_inputs,
        trace_fn,
        pass_dicts,
        extra_check,
        scalar_workaround,
        exclusive_arg_names,
        skip_duplicates=skip_duplicates,
        pattern_name=unique_name,
        get_decomp_fn=get_decomp_fn,
    )
    if pattern is not False:
        _known_precompiled_patterns.append(
            (search_fn, example_inputs, trace_fn, scalar_workaround, pattern)
        )
    if "PYTORCH_GEN_PATTERNS" in os.environ:
        raise NotImplementedError(
            "PYTORCH_GEN_PATTERNS: fxpass does not write serialized patterns (it needs none)"
        )


def gen_pattern_and_search_gm(
    search_fn: Callable[..., Any],
    example_inputs: Sequence[Any],
    trace_fn: Callable[..., Any],
    scalar_workaround: dict[str, float | int] | None = None,
    exclusive_arg_names: Sequence[str] = (),
    get_decomp_fn: Callable[..., Any] | None = None,
) -> tuple[PatternExpr, fx.GraphModule]:
    """The pattern Inductor registers for ``search_fn`` (literal types ignored), and the
    traced graph."""
    argnames = list(inspect.signature(search_fn).parameters)
    workaround = dict(scalar_workaround or {})
    from ._recipes import ArgInfo, _initial_inputs

    inputs = _initial_inputs(argnames, example_inputs, workaround)
    info = ArgInfo.of(argnames, inputs)
    flat = pytree.tree_leaves(inputs)
    gm = (
        trace_fn(search_fn, flat)
        if get_decomp_fn is None
        else trace_fn(search_fn, flat, get_decomp_fn=get_decomp_fn)
    )
    pattern = graph_to_pattern(
        gm,
        argnames=info.flat_names,
        ignore_types=IGNORED_TYPES,
        scalar_workaround=workaround,
        exclusive_arg_names=exclusive_arg_names,
    )
    return pattern, gm


def gen_pattern(
    search_fn: Callable[..., Any],
    example_inputs: Sequence[Any],
    trace_fn: Callable[..., Any],
    scalar_workaround: dict[str, float | int] | None = None,
    exclusive_arg_names: Sequence[str] = (),
) -> PatternExpr:
    """The pattern Inductor registers for ``search_fn``."""
    return gen_pattern_and_search_gm(
        search_fn, example_inputs, trace_fn, scalar_workaround, exclusive_arg_names
    )[0]
