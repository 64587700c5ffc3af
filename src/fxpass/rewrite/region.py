"""A match as a value, and the checks on a match as a whole.

When a pattern's structure has matched, :func:`complete` decides whether the region it
covers may be replaced — the rule's outputs are nodes of the match, its ``where`` holds,
no inner node is used outside (bar droppable asserts), no path leaves the region and comes
back — and returns the :class:`Match`, or a :class:`Failure` saying which check failed.
Both matchers (interpreted and compiled) end here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from torch import fx
from torch.fx import Node

from ..fxutil.dialect import aten_op
from ._state import MatchState
from .order import TopoOrder, find_cycle

if TYPE_CHECKING:
    from .rule import Rule

__all__ = ["Failure", "Match", "complete", "seen_through"]


@dataclass
class Match:
    """Where a rule matched: the root node, the names bound, and the nodes the match covers.

    ``outputs`` are the nodes whose uses the replacement takes over (the roots, then the
    rule's named outputs); ``nodes`` every node matched by an op pattern; ``dropped`` the
    assertion nodes hanging off inner nodes that go away with them; ``chains`` the runs of
    views and no-op casts that :meth:`P.through <fxpass.rewrite.P.through>` patterns saw
    through (innermost node first), and ``seen_through`` those of their nodes that stay in
    the graph (erased once nothing uses them).
    """

    rule: Rule
    root: Node
    bindings: dict[str, Any]
    nodes: list[Node]
    outputs: list[Node]
    dropped: list[Node] = field(default_factory=list)
    inputs: list[Node] = field(default_factory=list)  # filled in by the fixpoint driver
    chains: list[tuple[Node, ...]] = field(default_factory=list)
    seen_through: list[Node] = field(default_factory=list)

    def __getitem__(self, name: str) -> Any:
        try:
            return self.bindings[name]
        except KeyError:
            raise KeyError(
                f"the match of rule '{self.rule.name}' binds no '{name}'; "
                f"it binds {sorted(self.bindings)}"
            ) from None

    @property
    def graph(self) -> fx.Graph:
        return self.root.graph

    def __repr__(self) -> str:
        binds = ", ".join(
            f"{k}=%{v.name}" if isinstance(v, Node) else f"{k}={v!r}"
            for k, v in self.bindings.items()
        )
        return f"Match({self.rule.name} at %{self.root.name}: {binds})"


class Failure(NamedTuple):
    """Which whole-match check failed: ``kind`` is ``"output"`` (an output is not a node
    of the match), ``"where"`` (``detail``: the exception it raised, or None for False),
    ``"extra user"`` (``node`` is used by ``detail`` outside the match) or ``"cycle"``."""

    kind: str
    node: Node | None = None
    detail: Any = None


def complete(rule: Rule, st: MatchState) -> Match | Failure:
    """The match of ``rule`` whose structure ``st`` holds, or the check it fails."""
    env = st.env
    roots = st.roots
    outs = list(roots)
    for name in rule.outputs:
        outs.append(env[name])
    matched = dict.fromkeys(st.nodes)
    soft = _seen_through(st.chains, matched, outs) if st.chains else ()
    for o in outs:
        if o not in matched:
            return Failure("output", o)
    if rule.where is not None:
        try:
            ok = rule.where_holds(env)
        except Exception as e:  # broad: reported — a where that raises declines; explain says why
            return Failure("where", None, e)
        if not ok:
            return Failure("where")
    dropped: list[Node] = []
    if rule.contained:
        bad = _extra_user(matched, outs, rule.drop_users, dropped)
        if bad is not None:
            return bad
    if len(outs) > 1 or not rule.contained:
        order = st.order() if callable(st.order) else st.order
        if order is not None:
            # every matched node feeds a root, so the last root is the region's end; in a
            # contained match only the outputs and the views seen through have users
            # outside (the dropped asserts have none): a path out and back starts there
            hi = max(order[r] for r in roots) if len(roots) > 1 else order[roots[0]]
            region = set(matched).union(soft)
            exits = [*outs, *soft] if rule.contained else None
            via = find_cycle(order, region, hi, exits)
            if via is not None:
                return Failure("cycle", via)
    return Match(
        rule=rule,
        root=roots[0],
        bindings=dict(env),
        nodes=list(matched),
        outputs=outs,
        dropped=dropped,
        chains=list(st.chains),
        seen_through=list(soft),
    )


def _extra_user(matched: dict, outs: list, drop: frozenset, dropped: list) -> Failure | None:
    """An inner node used outside the match; droppable asserts go to ``dropped``."""
    out_set = set(outs)
    for n in matched:
        if n in out_set:
            continue
        for u in n.users:
            if u in matched:
                continue
            if drop and u.op == "call_function" and _droppable(u, drop):
                dropped.append(u)
                continue
            return Failure("extra user", n, u)
    return None


def _droppable(node: Node, drop: frozenset) -> bool:
    """An unused check (export's assert) of an op in ``drop``, in any spelling."""
    return not node.users and (node.target in drop or aten_op(node.target) in drop)


def _seen_through(chains: list, matched: dict, outs: list) -> list[Node]:
    """Sort the nodes P.through saw through: a chain starting at an inner node of the match
    joins the match (``matched``, in place: it must be used only inside it, and goes with
    it); the others stay in the graph, reading what replaces their input. Returns those."""
    soft: list[Node] = []
    out_set = set(outs)
    for chain in chains:
        start = chain[0].args[0]
        if start in matched and start not in out_set:
            for n in chain:
                matched.setdefault(n, None)
        else:
            soft.extend(n for n in chain if n not in matched)
    return soft


def lazy_order(graph: fx.Graph) -> Callable[[], Any]:
    """A function returning the graph's :class:`~fxpass.rewrite.order.TopoOrder`, made on
    first call (most attempts never need it)."""
    box: list[Any] = []

    def get() -> Any:
        if not box:
            box.append(TopoOrder(graph))
        return box[0]

    return get


#: :func:`_seen_through` for matchers outside this package that build their own matches
#: (``fxpass.compat.inductor`` follows Inductor's rules, not :func:`complete`'s).
seen_through = _seen_through
