"""Rules: a pattern, what to put in its place, and how the match may touch the graph.

>>> import torch
>>> from torch.fx.experimental.proxy_tensor import make_fx
>>> from fxpass.rewrite import P, Rule, rules
>>> aten = torch.ops.aten
>>> x = P.var("x")
>>> identities = rules("identities", [
...     (P(aten.mul.Tensor, x, 1), lambda x: x),     # one line per rewrite
...     Rule(P(aten.add.Tensor, x, 0), lambda x: x, name="add_zero"),
... ])
>>> gm = make_fx(lambda t: (t * 1 + 0).relu())(torch.randn(2, 3))
>>> identities(gm).modified                        # a RuleSet is a pass
True
>>> [n.name for n in gm.graph.nodes]
['t_1', 'relu', 'output']

A replacement is a function whose parameters are names the pattern binds (plus ``match``
for the :class:`~fxpass.rewrite.Match`). It is called with graph values wrapped as FX
proxies, so ``torch.ops.fxpass.rms_norm(x, w, eps)`` inside it adds a node to the graph. It
returns the value that takes the root's place — for rules with several ``outputs``, a tuple
(root first) or a dict keyed by output name — or ``None`` to decline the match.

A replacement may instead write its nodes itself: a :class:`GraphReplacement` (a traced
replacement graph, :class:`~fxpass.rewrite.traced.Replacement`, is one; compat's replay of a
recorded replacement another) is handed the match, the bindings and the rewrite's editor,
and makes each node with ``editor.create``.
"""

from __future__ import annotations

import inspect
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from torch.fx import Node

from ..edit.editor import Editor
from ..edit.location import caller_location, short
from ._state import MISSING
from .leaves import Pattern, mark_shared
from .match import match_at
from .pattern import P as _Op
from .region import Match
from .replay import Recordings

__all__ = ["DROPPABLE_USERS", "GraphReplacement", "Rule", "as_rule"]

#: Users of an inner node that do not stop a match; they are erased with it. Export hangs
#: ``aten._assert_tensor_metadata`` off intermediate values, which would otherwise block
#: every fusion until the asserts are removed.
DROPPABLE_USERS: frozenset[Any] = frozenset([torch.ops.aten._assert_tensor_metadata.default])


def _parameters(fn: Callable, what: str, bound: Sequence[str]) -> tuple[tuple[str, ...], bool]:
    """(names to pass, whether fn takes **kwargs); checks that every parameter can be given."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return tuple(bound), True
    names: list[str] = []
    takes_all = False
    for p in sig.parameters.values():
        if p.kind is p.VAR_KEYWORD:
            takes_all = True
        elif p.kind is p.VAR_POSITIONAL:
            continue
        elif p.name == "match" or p.name in bound:
            names.append(p.name)
        elif p.default is p.empty:
            raise TypeError(
                f"{what} parameter '{p.name}' is not a name the pattern binds "
                f"(it binds: {', '.join(bound) or 'nothing'}; 'match' gives the Match)"
            )
    return tuple(names), takes_all


def _call_with(fn: Callable, names: tuple[str, ...], takes_all: bool, env: dict, match: Any):
    if takes_all:
        kwargs = dict(env)
    else:
        kwargs = {n: env[n] for n in names if n in env}
    if "match" in names or takes_all:
        kwargs["match"] = match
    return fn(**kwargs)


class Rule:
    """A pattern, a replacement, and how the match may touch the rest of the graph.

    Args:
        pattern: a :class:`~fxpass.rewrite.Pattern`, or a tuple of patterns that share nodes
            (a multi-root pattern; the first is the anchor the index looks up).
        replacement: ``fn(**bindings)`` returning the new value(s) or None to decline; or a
            :class:`~fxpass.rewrite.Replacement` (a traced graph).
        name: shown in statistics, reports and provenance (default: the replacement's name,
            or ``file:line`` of the rule).
        outputs: names of matched inner nodes whose value is also used outside the match
            (e.g. a residual sum); the replacement returns a value for each, after the root's.
        where: ``pred(**bindings) -> bool``, checked before the match is accepted.
        contained: inner nodes may only be used inside the match (the outputs excepted).
            With False an inner node used elsewhere survives and keeps computing its value.
        drop_users: ops whose nodes hanging off inner nodes are erased with the match.
        replay: the replacement depends on nothing but the metadata of the values it is
            given (dtype, sizes, strides, device) and the literals: the rewriter runs it once
            per kind of match and copies the nodes it made at the others
            (:mod:`~fxpass.rewrite.replay`). A replacement that reads ``match``, a node's
            name, users or other metadata must not say so.
    """

    def __init__(
        self,
        pattern: Pattern | tuple[Pattern, ...],
        replacement: Any,
        *,
        name: str | None = None,
        outputs: Sequence[str] = (),
        where: Callable[..., bool] | None = None,
        contained: bool = True,
        drop_users: Iterable[Any] = DROPPABLE_USERS,
        location: str | None = None,
        replay: bool = False,
    ) -> None:
        roots = tuple(pattern) if isinstance(pattern, (tuple, list)) else (pattern,)
        if not roots or not all(isinstance(r, Pattern) for r in roots):
            raise TypeError(
                f"a rule's pattern must be a Pattern (P(...)) or a tuple of them, got {pattern!r}"
            )
        self.roots = roots
        self.pattern = roots[0] if len(roots) == 1 else roots
        self.replacement = replacement
        self.location = location or caller_location()
        self.outputs = tuple(outputs)
        self.where = where
        self.contained = contained
        self.drop_users = frozenset(drop_users)
        mark_shared(roots)
        bound: list[str] = []
        for r in roots:
            bound += [n for n in r.names() if n not in bound]
        self.bound_names = tuple(bound)
        for out in self.outputs:
            if out not in bound:
                raise ValueError(
                    f"rule output '{out}' is not a name the pattern binds "
                    f"(it binds: {', '.join(bound) or 'nothing'})"
                )
        self.name = name or _default_name(replacement, self.location)
        if isinstance(replacement, GraphReplacement):
            self._params, self._takes_all = (), True
        elif callable(replacement):
            self._params, self._takes_all = _parameters(
                replacement, f"rule '{self.name}': replacement", bound
            )
        else:
            raise TypeError(
                f"rule '{self.name}': replacement must be a function or a GraphReplacement, "
                f"got {replacement!r}"
            )
        self._where_params = (
            _parameters(where, f"rule '{self.name}': where", bound) if where else ((), False)
        )
        # how each later root hangs off the earlier ones: (shared pattern or name, depth)
        self.links = [_link(roots[:j], roots[j], self.name) for j in range(1, len(roots))]
        self._compiled: Any = MISSING  # see fxpass.rewrite.match.compiled
        # the replacement's recorded runs (see fxpass.rewrite.replay); a GraphReplacement or
        # a replacement that reads the match is run at every match
        replays = replay and not isinstance(replacement, GraphReplacement)
        self.recordings = Recordings() if replays and "match" not in self._params else None

    # ----- introspection ----------------------------------------------------------------
    @property
    def n_outputs(self) -> int:
        return len(self.roots) + len(self.outputs)

    def index_keys(self) -> frozenset | None:
        return self.roots[0].index_keys()

    def __repr__(self) -> str:
        return f"Rule({self.name!r}, {self.pattern!r}, at {short(self.location)})"

    # ----- matching (see fxpass.rewrite.match) ------------------------------------------
    def match(self, node: Node, *, order: Any = None) -> Match | None:
        """The :class:`~fxpass.rewrite.Match` of this rule rooted at ``node``, or None."""
        return match_at(self, node, order=order)

    def where_holds(self, env: dict[str, Any]) -> bool:
        """Whether the rule's ``where`` accepts these bindings (it may raise)."""
        names, takes_all = self._where_params
        return bool(_call_with(self.where, names, takes_all, env, None))

    # ----- replacing --------------------------------------------------------------------
    def replacement_names(self) -> tuple[str, ...] | None:
        """The bound names the replacement takes (None: all of them)."""
        return None if self._takes_all else self._params

    def build(self, bindings: dict[str, Any], match: Any, editor: Editor) -> Any:
        """Call the replacement (inside the rewriter, with proxies for nodes); a
        :class:`GraphReplacement` is handed ``editor``, the rewrite's."""
        rep = self.replacement
        if isinstance(rep, GraphReplacement):
            return rep.write(match, bindings, editor)
        return _call_with(rep, self._params, self._takes_all, bindings, match)


class GraphReplacement:
    """A replacement that writes its nodes itself, through the editor it is handed.

    Subclass it and define :meth:`write`; a :class:`Rule` whose replacement is one calls
    ``write(match, bindings, editor)`` inside the rewrite, at the graph's insertion point
    (before the match's last output). ``bindings`` maps the names the pattern binds to FX
    proxies of the bound nodes (literals as they are); ``editor`` is the rewrite's
    (:meth:`Editor.create` makes a node there and tells the run through the rewrite's change).
    ``write`` returns what a replacement function returns: the value(s) taking the outputs'
    places, or None to decline. :class:`~fxpass.rewrite.traced.Replacement` (a traced
    replacement graph) is one.
    """

    def write(self, match: Any, bindings: dict[str, Any], editor: Editor) -> Any:
        raise NotImplementedError(
            f"{type(self).__name__} must define write(match, bindings, editor)"
        )

    def known_values(self) -> Mapping[Any, Any]:
        """Values of nodes the last :meth:`write` made that the replacement knows exactly
        (what their op computes on their inputs' values, in the graph's fake mode, e.g.
        from a trace made on those very values); the rewrite gives them as ``meta['val']``
        instead of computing them again. None known by default."""
        return {}


def _default_name(replacement: Any, location: str) -> str:
    name = getattr(replacement, "__name__", None)
    if name and name != "<lambda>":
        return name
    return short(location).rsplit("/", 1)[-1]


def _link(earlier: Sequence[Pattern], root: Pattern, rule_name: str):
    """(shared pattern or bound name, graph depth) connecting ``root`` to earlier roots.

    Depth counts op patterns only: alternatives and lists do not stand for a graph node.
    """
    seen_ids = {id(p) for r in earlier for p in r.walk()}
    names = {n for r in earlier for n in r.names()}
    queue: deque[tuple[Pattern, int]] = deque([(root, 0)])
    visited: set[int] = set()
    while queue:
        p, depth = queue.popleft()
        if depth and id(p) in seen_ids:
            return p, depth
        if depth and p.name and p.name in names:
            return p.name, depth
        if id(p) in visited:
            continue
        visited.add(id(p))
        if isinstance(p, _Op):
            queue.extend((c, depth + 1) for c in p.children())
        else:
            queue.extendleft((c, depth) for c in reversed(list(p.children())))
    raise ValueError(
        f"rule '{rule_name}': every root of a multi-root pattern must share a node or a "
        "name with the roots before it (so the matcher can find it from there)"
    )


def as_rule(item: Any) -> Rule:
    """A :class:`Rule` from a rule or a ``(pattern, replacement)`` tuple."""
    if isinstance(item, Rule):
        return item
    if isinstance(item, tuple) and len(item) in (2, 3):
        pattern, replacement = item[0], item[1]
        opts: Mapping[str, Any] = item[2] if len(item) == 3 else {}
        first = pattern[0] if isinstance(pattern, (tuple, list)) else pattern
        loc = getattr(first, "location", None) or caller_location()
        return Rule(
            pattern,
            replacement,
            location=opts.get("location", loc),
            **{k: v for k, v in opts.items() if k != "location"},
        )
    raise TypeError(
        f"expected a Rule or a (pattern, replacement) tuple, got {type(item).__name__}: {item!r}"
    )
