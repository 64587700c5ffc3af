"""torch's matching rules as a matcher policy: what ``SubgraphMatcher`` does differently.

``fxpass.compat.fx`` mimics torch's ``SubgraphMatcher`` and ``fxpass.partition`` its
pattern partitioner on the interpreted matcher; :class:`TorchMatching` overrides the few
handlers whose rules differ, so the plain matcher stays free of them:

* ``injective``: two pattern nodes may not match the same graph node;
* ``exact_literals``: literals match only with the same Python type;
* ``ignore_literals``: literals in the pattern match any literal or node, and a literal in
  the graph matches a variable already bound (to anything else);
* ``name_match``: a graph node whose name contains this string matches the pattern's
  anchors (``name_anchors``) whatever its op; as in torch, only there: the nodes below an
  anchor match by their ops.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from torch.fx import Node

from ._state import MISSING, MatchState
from .arguments import Layout
from .constraint import lit_eq, lit_eq_exact
from .interpreted import Cont, Interpreter, always
from .leaves import Var
from .pattern import P

__all__ = ["TorchMatching"]


def _anything(p: Any, v: Any) -> bool:
    return True


class TorchMatching(Interpreter):
    """The interpreter with torch's ``SubgraphMatcher`` rules (see the module docstring)."""

    compiled = False

    def __init__(
        self,
        *,
        injective: bool = False,
        exact_literals: bool = False,
        ignore_literals: bool = False,
        name_match: str = "",
        name_anchors: Iterable[Any] = (),
    ) -> None:
        super().__init__()
        self.injective = injective
        self.name_match = name_match
        self.name_anchors = frozenset(id(p) for p in name_anchors)
        self.ignore_literals = ignore_literals
        if ignore_literals:
            self.lit_ok = _anything
        elif exact_literals:
            self.lit_ok = lit_eq_exact
        else:
            self.lit_ok = lit_eq
        if name_match:  # any node may stand for an op: no look ahead at the arguments' ops
            self.quick = always

    def name_hit(self, p: Any, v: Node) -> bool:
        """Whether ``v`` matches anchor pattern ``p`` by its name, whatever its op."""
        return bool(self.name_match) and id(p) in self.name_anchors and self.name_match in v.name

    def unlisted(self, p: P, v: Node) -> Layout | None:
        if self.name_hit(p, v):
            return p.layout(v.target if v.op == "call_function" else v.op)
        return None

    def op(self, p: P, v: Any, st: MatchState, k: Cont) -> bool:
        if not self.injective or v.__class__ is not Node or (p._shared and id(p) in st.memo):
            return super().op(p, v, st, k)
        if v in st.used:
            return False
        st.used[v] = p
        if super().op(p, v, st, k):
            return True
        del st.used[v]
        return False

    def var(self, p: Var, v: Any, st: MatchState, k: Cont) -> bool:
        bound = p.name is not None and p.name in st.env
        if bound and self.ignore_literals and v.__class__ is not Node:
            return k()  # a literal is a wildcard, even against a bound variable
        if not self.injective or not isinstance(v, Node):
            return super().var(p, v, st, k)
        owner = st.used.get(v, MISSING)
        if owner is MISSING:
            st.used[v] = p
            if super().var(p, v, st, k):
                return True
            del st.used[v]
            return False
        if owner is not p:
            return False
        return super().var(p, v, st, k)
