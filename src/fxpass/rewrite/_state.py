"""The mutable state of one matching attempt: bindings, matched nodes, and why it failed.

Matching is a backtracking search written in continuation-passing style: every pattern's
``_m(value, state, k)`` checks its own constraints, records what it bound, calls the
continuation ``k()`` for the rest of the pattern, and undoes its bindings when ``k`` fails.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch.fx import Node

MISSING: Any = type("MISSING", (), {"__repr__": lambda self: "<missing>"})()


class MatchState:
    """Bindings of one attempt. Options mirror torch's matcher where the compat layer needs them.

    ``injective``: two pattern nodes may not match the same graph node (torch's rule).
    ``exact_literals``: literals match only with the same Python type (torch's rule).
    ``ignore_literals``: literals in the pattern match any literal or node (torch's option).
    ``name_match``: a graph node whose name contains this string matches any pattern node.
    ``explain``: remember the deepest failure and its reason (see :mod:`fxpass.rewrite.explain`).
    """

    __slots__ = (
        "chains",
        "env",
        "exact_literals",
        "explain",
        "ignore_literals",
        "injective",
        "memo",
        "name_match",
        "nodes",
        "order",
        "plain",
        "roots",
        "used",
        "why",
        "why_depth",
        "why_node",
    )

    def __init__(
        self,
        *,
        injective: bool = False,
        exact_literals: bool = False,
        ignore_literals: bool = False,
        name_match: str = "",
        explain: bool = False,
        order: Any = None,
    ) -> None:
        self.env: dict[str, Any] = {}
        self.memo: dict[int, Any] = {}
        self.nodes: list[Node] = []
        # the runs of nodes a P.through pattern saw through (innermost first), in match order
        self.chains: list[tuple[Node, ...]] = []
        self.roots: list[Node] = []  # the node each root of a multi-root pattern matched
        self.used: dict[Node, Any] = {}
        self.injective = injective
        self.exact_literals = exact_literals
        self.ignore_literals = ignore_literals
        self.name_match = name_match
        self.explain = explain
        self.order = order
        # the default mode, where a rule's compiled matcher may stand in for the interpreter
        self.plain = not (explain or injective or exact_literals or ignore_literals or name_match)
        self.why: str | None = None
        self.why_depth = -1
        self.why_node: Node | None = None

    def reset(self) -> None:
        if self.env:
            self.env.clear()
        if self.memo:
            self.memo.clear()
        if self.nodes:
            self.nodes.clear()
        if self.used:
            self.used.clear()
        if self.chains:
            self.chains.clear()

    def miss(self, reason: Callable[[], str], node: Any = None, *, whole: bool = False) -> bool:
        """Record why matching failed here (explain mode keeps the deepest failure); False.

        ``whole``: the pattern's structure matched and a check on the whole match failed;
        such a failure explains more than any partial one."""
        depth = len(self.nodes) + (100_000 if whole else 0)
        if depth > self.why_depth:
            self.why_depth = depth
            self.why = reason()
            self.why_node = node if isinstance(node, Node) else None
        return False
