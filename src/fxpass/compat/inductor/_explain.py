"""Why a registered pattern did not match: its near misses, for any ``PatternMatcherPass``.

Inductor says nothing about a miss unless ``TORCHINDUCTOR_PATTERN_MATCH_DEBUG`` names the
node. ``pm.explain(gm)`` replays each registered pattern at the nodes calling its anchor op
with fxpass's explaining matcher (Inductor's rules, recording the deepest failure), and for
replacements also the check Inductor makes on the matched shapes: wrong op, extra users, a
literal (an ``eps``) that differs, a size that differs, the ``extra_check``. With the
improvements on it also says which sites only they match.

>>> print(pm.explain(gm))                                       # doctest: +SKIP
pattern 'rms_quant' (CallFunction(aten.mul.Tensor, ...)): 3 of 9 candidates match, 2 more with the improvements
  6 x extra users
  closest miss at %mul_12: extra users: %add_3 has 2 users, the pattern gives it 1 ...
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from torch import fx
from torch.fx import Node

from ...fxutil.fx_internals import sort_key
from ...rewrite.explain import min_ops
from ...rewrite.match import MatchState, attempt
from ...rewrite.region import lazy_order
from ._compile import compile_pattern
from ._entry import EXPLAIN_RELAXED, EXPLAIN_STRICT, PatternEntry, find
from ._match import Match

__all__ = ["PassExplanation", "PatternExplanation", "explain_pass", "miss_hints"]

#: A pattern "was tried many times and matched few" when tried this often...
MANY = 8
#: ...and matched at most this share; the report then names its closest misses.
FEW = 0.25


@dataclass
class PatternExplanation:
    """One registered pattern over a graph: where it matches, where only the improvements
    match it, and why it misses elsewhere (``misses``: (node, reason, depth), deepest first)."""

    name: str
    pattern: Any
    candidates: int = 0
    matches: list[Node] = field(default_factory=list)
    extra: list[Node] = field(default_factory=list)
    misses: list[tuple[Node, str, int]] = field(default_factory=list)

    def reasons(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for _, reason, _ in self.misses:
            head = reason.split(":", 1)[0]
            counts[head] = counts.get(head, 0) + 1
        return counts

    def __str__(self) -> str:
        head = f"pattern {self.name!r} ({_short(self.pattern)})"
        if not self.candidates:
            return f"{head}: no node calls its anchor op"
        text = f"{head}: {len(self.matches)} of {self.candidates} candidates match"
        if self.extra:
            text += f", {len(self.extra)} more with the improvements"
        lines = [text]
        for reason, n in sorted(self.reasons().items(), key=lambda kv: -kv[1])[:5]:
            lines.append(f"  {n:>4} x {reason}")
        for node, reason, _ in self.misses[:2]:
            lines.append(f"  miss at %{node.name}: {reason}")
        return "\n".join(lines)


@dataclass
class PassExplanation:
    """One :class:`PatternExplanation` per registered pattern."""

    patterns: list[PatternExplanation]

    def __iter__(self) -> Iterator[PatternExplanation]:
        return iter(self.patterns)

    def __len__(self) -> int:
        return len(self.patterns)

    def __getitem__(self, name: str) -> PatternExplanation:
        for p in self.patterns:
            if p.name == name:
                return p
        raise KeyError(f"no pattern named {name!r}; patterns: {[p.name for p in self]}")

    def __str__(self) -> str:
        return "\n".join(str(p) for p in self.patterns) or "no patterns registered"


def _short(pattern: Any) -> str:
    text = repr(pattern)
    return text if len(text) <= 80 else text[:77] + "..."


def _entries(
    patterns: dict[tuple[str, Any], list[PatternEntry]],
) -> dict[int, tuple[PatternEntry, list]]:
    """Each entry once, with the (op, target) keys it is filed under."""
    out: dict[int, tuple[PatternEntry, list]] = {}
    for key, entries in patterns.items():
        for e in entries:
            out.setdefault(id(e), (e, []))[1].append(key)
    return out


def _candidates(graph: fx.Graph, keys: list) -> list[Node]:
    nodes: list[Node] = []
    for op, target in keys:
        if op == "call_module":
            nodes.extend(graph.find_nodes(op="call_module"))
        else:
            nodes.extend(graph.find_nodes(op=op, target=target))
    return sorted(set(nodes), key=sort_key)


def why_not(entry: PatternEntry, node: Node, improve: bool) -> tuple[bool, bool, str, int]:
    """(matches by Inductor's rules, matches only by the relaxed ones, why not, depth)."""
    st = MatchState(order=lazy_order(node.graph))
    m = find(entry.pattern, node, st, improve)
    if m is not None:
        reason = _check_failure(entry, m)
        if reason is None:
            return (not m.extra, m.extra, "", 0)
        return (False, False, reason, 10_000)
    compiled = compile_pattern(entry.pattern)
    st = MatchState(order=lazy_order(node.graph))
    if attempt(compiled.rule, node, st, EXPLAIN_STRICT):  # the outputs before the unanchored
        return (False, False, compiled.unanchored or "no match", 10_000)
    reason, depth = st.why or "no match", st.why_depth
    if improve:
        st = MatchState(order=lazy_order(node.graph))
        attempt(compile_pattern(entry.pattern, relaxed=True).rule, node, st, EXPLAIN_RELAXED)
        if st.why_depth > depth:
            reason, depth = st.why or reason, st.why_depth
    return (False, False, reason, depth)


def _check_failure(entry: PatternEntry, m: Match) -> str | None:
    explain = getattr(entry, "explain_check", None)
    try:
        if explain is not None:
            return explain(m)
        ok = entry.extra_check(m)
    except Exception as e:  # broad: reported — the explanation says what the check raised
        return f"the check raised {type(e).__name__}: {e}"
    return None if ok else "extra_check returned False"


def _explain_entry(entry: PatternEntry, keys: list, graph: fx.Graph, improve: bool, limit=None):
    out = PatternExplanation(entry.entry_name, entry.pattern)
    need = max(1, min_ops(compile_pattern(entry.pattern).rule.roots[0]) // 2)
    for node in _candidates(graph, keys):
        out.candidates += 1
        if limit is not None and out.candidates > limit:
            break
        strict, extra, reason, depth = why_not(entry, node, improve)
        if strict:
            out.matches.append(node)
        elif extra:
            out.extra.append(node)
        elif depth >= need:
            out.misses.append((node, reason, depth))
    out.misses.sort(key=lambda t: -t[2])
    return out


def explain_pass(patterns: Any, graph: fx.Graph, improve: bool) -> PassExplanation:
    """The explanation of every registered pattern over ``graph``."""
    return PassExplanation(
        [_explain_entry(e, keys, graph, improve) for e, keys in _entries(patterns).values()]
    )


def miss_hints(patterns: Any, graph: fx.Graph, stats: Any, improve: bool) -> list[str]:
    """Report hints for patterns tried at many nodes that matched few, naming near misses."""
    hints = []
    for entry, keys in _entries(patterns).values():
        tried, matched = stats.by_entry.get(entry.entry_name, (0, 0))
        if tried < MANY or matched > FEW * tried:
            continue
        e = _explain_entry(entry, keys, graph, improve, limit=64)
        if not e.misses:
            continue
        lines = [
            f"pattern '{e.name}' was tried at {tried} nodes and matched {matched}; near misses, e.g."
        ]
        lines += [f"  %{node.name}: {reason}" for node, reason, _ in e.misses[:2]]
        lines.append("  (PatternMatcherPass.explain(gm) says more)")
        hints.append("\n".join(lines))
    return hints
