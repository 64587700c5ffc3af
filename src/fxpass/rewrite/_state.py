"""The mutable state of one matching attempt: bindings, matched nodes, and why it failed.

Matching is a backtracking search written in continuation-passing style (see
:mod:`fxpass.rewrite.interpreted`): every pattern checks its own constraints, records what it
bound here, calls the continuation ``k()`` for the rest of the pattern, and undoes its
bindings when ``k`` fails. How it matches (plainly, explaining, or by torch's rules) is
the matcher's policy, not the state's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch.fx import Node

MISSING: Any = type("MISSING", (), {"__repr__": lambda self: "<missing>"})()


class MatchState:
    """Bindings of one attempt; ``found`` holds the :class:`~fxpass.rewrite.Match` when one
    completes. ``order`` (a topological order, or a function making one) serves the cycle
    check; ``why``/``why_node``/``why_depth`` hold the deepest failure an explaining
    matcher saw."""

    __slots__ = (
        "chains",
        "env",
        "found",
        "memo",
        "nodes",
        "order",
        "roots",
        "used",
        "why",
        "why_depth",
        "why_node",
    )

    def __init__(self, *, order: Any = None) -> None:
        self.env: dict[str, Any] = {}
        self.memo: dict[int, Any] = {}  # id(shared pattern) -> what it matched
        self.nodes: list[Node] = []
        # the runs of nodes a P.through pattern saw through (innermost first), in match order
        self.chains: list[tuple[Node, ...]] = []
        self.roots: list[Node] = []  # the node each root of a multi-root pattern matched
        self.used: dict[Node, Any] = {}  # torch's rule: graph node -> the pattern it matched
        self.order = order
        self.found: Any = None
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
        self.found = None

    def miss(self, reason: Callable[[], str], node: Any = None, *, whole: bool = False) -> bool:
        """Record why matching failed here, keeping the deepest failure; False.

        ``whole``: the pattern's structure matched and a check on the whole match failed;
        such a failure explains more than any partial one."""
        depth = len(self.nodes) + (100_000 if whole else 0)
        if depth > self.why_depth:
            self.why_depth = depth
            self.why = reason()
            self.why_node = node if isinstance(node, Node) else None
        return False
