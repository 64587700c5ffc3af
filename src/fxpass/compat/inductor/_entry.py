"""Pattern entries: a pattern, its ``extra_check`` and what to do with a match.

``register_graph_pattern`` files a :class:`GraphPatternEntry` (a handler doing the surgery),
``register_replacement`` a :class:`ReplacementPatternEntry` (a traced replacement), under
``(op, target)`` of every function the pattern's anchor may call, in each pass dict given —
as Inductor files them. :func:`find` is how a pass run matches an entry at a node: by the
strict (Inductor's) rules, then, with the improvements on, by the relaxed ones.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from torch import fx
from torch.fx import Node

from ...rewrite import Surgery
from ...rewrite.match import MatchState, attempt
from ...rewrite.region import lazy_order
from ._compile import compile_pattern
from ._exprs import MATCHER, FailedMatch, PatternExpr, pattern_text
from ._match import Match, read_back
from ._matching import InductorMatching

__all__ = [
    "GraphPatternEntry",
    "PatternEntry",
    "check_and_add_duplicate_pattern",
    "debug_node",
    "find",
    "match_expr",
    "register_graph_pattern",
]

#: Inductor's logger: ``TORCHINDUCTOR_PATTERN_MATCH_DEBUG=<node names>|all`` logs the
#: attempts at those nodes there, as Inductor does.
log = logging.getLogger("torch._inductor.pattern_matcher")


def debug_node(name: str, value: str | None = None) -> bool:
    """Whether ``TORCHINDUCTOR_PATTERN_MATCH_DEBUG`` (or ``value``, read from it) asks for the
    attempts at this node."""
    if value is None:
        value = os.environ.get("TORCHINDUCTOR_PATTERN_MATCH_DEBUG")
    if not value:
        return False
    return value == "all" or name in value.split(",")


STRICT = InductorMatching()
RELAXED = InductorMatching(relaxed=True)
EXPLAIN_STRICT = InductorMatching(explaining=True)
EXPLAIN_RELAXED = InductorMatching(relaxed=True, explaining=True)


def _return_true(match: Match) -> bool:
    return True


@dataclasses.dataclass
class PatternEntry:
    """A pattern and its ``extra_check(match) -> bool``; subclasses say what ``apply`` does."""

    pattern: PatternExpr
    extra_check: Callable[[Match], Any]

    def apply(self, match: Match, graph: fx.Graph, node: Node) -> None:
        raise NotImplementedError

    def edit(self, match: Match, graph: fx.Graph, node: Node) -> Any:
        """How a pass run applies ``match``: an edit for :func:`fxpass.rewrite.guided` to
        make (here: ``apply``, which edits the graph itself)."""
        run = match.run
        return Surgery(
            lambda: self.apply(match, graph, node),
            self.entry_name,
            done=run.replaced if run is not None else None,
        )

    def register(self, pass_dicts: Any, target: Any = None, prepend: bool = False) -> None:
        """File this entry in ``pass_dicts`` (a pass, a dict, or a list of them) under each
        function of the pattern's anchor (or ``target``)."""
        if target is None:
            fns = getattr(self.pattern, "fns", None)
            if fns is None:
                raise TypeError(
                    f"cannot register {self.pattern!r}: the pattern must start with a "
                    "CallFunction, CallMethod or CallModule (or give target=)"
                )
            for fn in fns:
                self.register(pass_dicts, fn, prepend=prepend)
        elif isinstance(pass_dicts, (list, tuple)):
            for x in pass_dicts:
                self.register(x, target, prepend=prepend)
        else:
            entries = pass_dicts[(self.pattern.op, target)]
            if prepend:
                entries.insert(0, self)
            else:
                entries.append(self)

    @property
    def entry_name(self) -> str:
        return getattr(self, "pattern_name", None) or type(self.pattern).__name__


@dataclasses.dataclass
class GraphPatternEntry(PatternEntry):
    """A pattern whose ``handler(match, *args, **kwargs)`` edits the graph itself."""

    handler: Callable[..., Any]

    @property
    def entry_name(self) -> str:
        return getattr(self.handler, "__name__", "graph_pattern")

    def apply(self, match: Match, graph: fx.Graph, node: Node) -> None:
        with graph.inserting_before(node):
            self.handler(match, *match.args, **match.kwargs)


def register_graph_pattern(
    pattern: PatternExpr,
    extra_check: Callable[[Match], Any] = _return_true,
    *,
    pass_dict: Any,
    prepend: bool = False,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: run the handler ``fn(match, *args, **kwargs)`` at every match of
    ``pattern`` when ``pass_dict`` (a :class:`PatternMatcherPass`) is applied."""

    def decorator(handler: Callable[..., Any]) -> Callable[..., Any]:
        if not callable(handler):
            raise TypeError(
                f"register_graph_pattern: the handler must be callable, got {handler!r}"
            )
        GraphPatternEntry(pattern=pattern, extra_check=extra_check, handler=handler).register(
            pass_dict, prepend=prepend
        )
        return handler

    return decorator


# ----- matching one entry -----------------------------------------------------------------
def find(pattern: PatternExpr, node: Node, st: MatchState, improve: bool) -> Match | None:
    """The match of ``pattern`` at ``node`` by Inductor's rules or (``improve``) the relaxed
    ones; a relaxed-only match has ``extra`` set."""
    compiled = compile_pattern(pattern)
    if compiled.unanchored is not None:
        return None
    if attempt(compiled.rule, node, st, STRICT):
        return read_back(compiled, st.found)
    if improve:
        compiled = compile_pattern(pattern, relaxed=True)
        if attempt(compiled.rule, node, st, RELAXED):
            return read_back(compiled, st.found, extra=True)
    return None


def match_expr(pattern: PatternExpr, node: Node, improve: bool = False) -> Match | FailedMatch:
    """``pattern.match(node)``: the match, or a FailedMatch saying why not."""
    st = MatchState(order=lazy_order(node.graph))
    m = find(pattern, node, st, improve)
    if m is not None:
        return m
    why = explain_failure(pattern, node, improve)
    return FailedMatch("{}", why)


MATCHER.append(match_expr)


def explain_failure(pattern: PatternExpr, node: Node, improve: bool = False) -> str:
    """Why ``pattern`` does not match at ``node`` (the deepest failure of the search)."""
    compiled = compile_pattern(pattern, relaxed=improve)
    st = MatchState(order=lazy_order(node.graph))
    interp = EXPLAIN_RELAXED if improve else EXPLAIN_STRICT
    if attempt(compiled.rule, node, st, interp):
        return compiled.unanchored or "matches"
    return st.why or f"no match at %{node.name}"


# ----- duplicates -------------------------------------------------------------------------
def check_and_add_duplicate_pattern(
    pattern: PatternExpr,
    graph: fx.Graph | None,
    seen_patterns: dict[str, list[str | None]],
    skip_duplicates: bool = False,
) -> bool:
    """Whether ``pattern`` was registered before (the same structure traced from the same
    graph): True with ``skip_duplicates``, a RuntimeError without; False (and recorded) if
    it is new."""
    text = pattern_text(pattern)
    known = seen_patterns.get(text)
    if not known:
        seen_patterns[text].append(str(graph) if graph is not None else None)
        return False
    if graph is None:
        if skip_duplicates:
            return True
        raise RuntimeError(f"Duplicate pattern: {text} with no graph")
    new = str(graph)
    if new in known:
        if skip_duplicates:
            return True
        raise RuntimeError(f"Duplicate pattern: {text} with duplicated match graph {new}")
    known.append(new)
    return False


def new_seen_patterns() -> dict[str, list[str | None]]:
    return defaultdict(list)


def as_list(pass_dicts: Any) -> Sequence[Any]:
    return list(pass_dicts) if isinstance(pass_dicts, (list, tuple)) else [pass_dicts]
