"""Pattern partitions: pattern matches and supported ops, merged into maximal partitions.

ExecuTorch's ``generate_pattern_op_partitions``: a backend that runs a few ops anywhere and
some ops only inside known shapes (a ``mul`` only as part of an RMSNorm, an ``addmm`` only
with its bias) describes the first with an operator support and the second with patterns.
Every node of a pattern match counts as supported; the capability partitioner then cuts the
largest cycle-free partitions of the supported nodes (single-node partitions allowed, as
ExecuTorch does).

Patterns are found with fxpass's rewrite engine (:mod:`fxpass.rewrite`: op-indexed, so each
pattern is tried only at nodes calling its root op). A pattern is

* a PyTorch function with example inputs, ``(fn, example_inputs)`` or
  ``(fn, example_inputs, ir)``, traced by the engine into the graph's IR (``"aten"`` by
  default; scalar parameters such as ``eps`` match any literal);
* an ``fx.Graph`` (or a ``GraphModule``) captured in the same dialect as the graph — its
  placeholders match anything, its output's nodes are the roots;
* a rewrite pattern ``P(...)``, or a ``Rule``.

>>> parts = pattern_partitions(gm, [norm_graph], op_support="ops(aten.add)")  # doctest: +SKIP

A match whose nodes cannot all sit in one partition without a cycle through an unsupported
node is split, as in ExecuTorch; :func:`pattern_matches` returns the matches themselves.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import fx

from ..rewrite.match import Matcher
from ..rewrite.pattern import P, Pattern
from ..rewrite.rule import Rule
from ..rewrite.torchlike import TorchMatching
from .base import Partition, module_and_graph
from .capability import capability_partitions
from .support import OperatorSupportBase, any_chain, node_support, parse_support

__all__ = [
    "generate_pattern_op_partitions",
    "graph_pattern",
    "pattern_matches",
    "pattern_partitions",
]


def _keep(*args: Any, **kwargs: Any) -> None:
    """Matching only: this replacement is never called."""
    return None


def graph_pattern(pattern: fx.Graph | fx.GraphModule) -> Pattern | tuple[Pattern, ...]:
    """A rewrite pattern from a pattern graph: placeholders (and ``get_attr``) match any
    value, every other node its op with its arguments, the output's nodes are the roots."""
    graph = pattern.graph if isinstance(pattern, fx.GraphModule) else pattern
    env: dict[fx.Node, Pattern] = {}
    roots: list[Pattern] = []
    for node in graph.nodes:
        if node.op in ("placeholder", "get_attr"):
            env[node] = P.var(node.name)
            continue
        if node.op == "output":
            outs = fx.node.map_arg(node.args[0], lambda n: n)
            flat = outs if isinstance(outs, (list, tuple)) else [outs]
            roots = [env[n] for n in flat if isinstance(n, fx.Node) and n.op != "placeholder"]
            continue
        args = fx.node.map_arg(node.args, env.__getitem__)
        kwargs = fx.node.map_arg(node.kwargs, env.__getitem__)
        if node.op == "call_function":
            env[node] = P(node.target, *args, **kwargs)
        elif node.op == "call_method":
            env[node] = P.method(node.target, *args, **kwargs)
        else:
            env[node] = P.module(node.target, *args, **kwargs)
    if not roots:
        raise ValueError("pattern graph computes nothing: its output returns only placeholders")
    return roots[0] if len(roots) == 1 else tuple(roots)


def _traced(pattern: tuple, index: int) -> Rule:
    from ..rewrite.traced import traced_rule

    fn, inputs, *rest = pattern
    ir = rest[0] if rest else "aten"
    return traced_rule(
        fn,
        _keep,
        list(inputs),
        ir=ir,
        name=f"pattern_{index}",
        trace_replacement=False,
        contained=False,
    )


def _as_rule(pattern: Any, index: int) -> Rule:
    if isinstance(pattern, Rule):
        return pattern
    if (
        isinstance(pattern, tuple)
        and pattern
        and callable(pattern[0])
        and not isinstance(pattern[0], Pattern)
    ):
        return _traced(pattern, index)
    if isinstance(pattern, (fx.Graph, fx.GraphModule)):
        pattern = graph_pattern(pattern)
    if isinstance(pattern, Pattern) or (
        isinstance(pattern, tuple) and all(isinstance(p, Pattern) for p in pattern)
    ):
        # contained=False: a match is wanted even where its inner values are used elsewhere
        return Rule(pattern, _keep, name=f"pattern_{index}", contained=False)
    raise TypeError(
        f"pattern {index}: expected (function, example_inputs), an fx.Graph, a GraphModule, a "
        f"rewrite pattern P(...) or a Rule, got {type(pattern).__name__}"
    )


def pattern_matches(
    graph_module: fx.GraphModule | fx.Graph | torch.export.ExportedProgram,
    patterns: Iterable[Any],
    *,
    ignore_literals: bool = False,
) -> list[list[fx.Node]]:
    """The nodes of every match of every pattern (placeholders of a pattern excluded), in
    graph order: one list per match, each pattern at each root node at most once."""
    _, graph = module_and_graph(graph_module)
    # torch's option: a literal in the pattern matches anything
    interp = TorchMatching(ignore_literals=True) if ignore_literals else None
    matchers = [Matcher([_as_rule(p, i)], interp) for i, p in enumerate(patterns)]
    found: list[list[fx.Node]] = []
    for node in graph.nodes:
        for matcher in matchers:
            if not matcher.rules_for(node):
                continue
            match = matcher.match(node)
            if match is not None:
                found.append([n for n in match.nodes if n.op != "placeholder"])
    return found


def pattern_partitions(
    graph_module: fx.GraphModule | fx.Graph | torch.export.ExportedProgram,
    patterns: Iterable[Any] = (),
    op_support: OperatorSupportBase | Any = None,
    *,
    partitions: Iterable[Iterable[fx.Node]] = (),
    ignore_literals: bool = False,
    allows_single_node_partition: bool = True,
    horizontal: bool = True,
) -> list[Partition]:
    """Maximal cycle-free partitions of the nodes that ``op_support`` accepts or that belong
    to a match of one of ``patterns`` (or to one of the given node lists ``partitions``).

    Returns :class:`Partition` objects in graph order (see
    :func:`~fxpass.partition.capability_partitions`).
    """
    matched: set[fx.Node] = set()
    for nodes in pattern_matches(graph_module, patterns, ignore_literals=ignore_literals):
        matched.update(nodes)
    for nodes in partitions:
        matched.update(nodes)
    if op_support is None and not matched:
        if not patterns and not partitions:
            raise ValueError(
                "pattern_partitions needs patterns, node lists or an op_support to partition by"
            )
        return []
    in_match = node_support(matched.__contains__)
    support = in_match if op_support is None else any_chain(parse_support(op_support), in_match)
    return capability_partitions(
        graph_module,
        support,
        allows_single_node_partition=allows_single_node_partition,
        horizontal=horizontal,
    )


def generate_pattern_op_partitions(
    graph_module: fx.GraphModule,
    patterns: Sequence[fx.Graph] | None = None,
    partitions_list: Sequence[Sequence[fx.Node]] | None = None,
    op_support: OperatorSupportBase | None = None,
    ignore_literals: bool = False,
) -> list[Partition]:
    """ExecuTorch's signature for :func:`pattern_partitions`."""
    if patterns is None and partitions_list is None and op_support is None:
        raise ValueError(
            "generate_pattern_op_partitions: give patterns, a partitions_list or an op_support"
        )
    return pattern_partitions(
        graph_module,
        patterns or (),
        op_support,
        partitions=partitions_list or (),
        ignore_literals=ignore_literals,
    )
