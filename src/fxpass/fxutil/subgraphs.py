"""The graphs a graph runs through control flow: the branches of ``torch.cond``, the bodies
of ``torch.map``, ``while_loop`` and ``scan``, and the regions export wraps in a grad mode or
autocast.

Each is a GraphModule attribute of the module that reads it with a ``get_attr`` node and
hands it to a higher-order op. A pass that rewrites ops where they are (a fusion) may
rewrite them there too: the subgraph's nodes carry the same metadata (``val``) as the
graph's own, and its placeholders stand for the values the op passes in.

>>> ep = torch.export.export(model_with_cond, args)    # doctest: +SKIP
>>> [name for name, _ in control_flow_subgraphs(ep.graph_module)]  # doctest: +SKIP
['true_graph_0', 'false_graph_0']

Nested control flow is walked without recursion (a stack), so no depth of nesting reaches
Python's recursion limit.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import fx

__all__ = ["CONTROL_FLOW_OPS", "control_flow_subgraphs"]


#: Names of the higher-order ops whose subgraph arguments run as ordinary graphs of their
#: own. Names, not the operator objects: a pass's uuid digests the globals its code reads,
#: and an operator's state changes once it has run (the cache key would change with it).
CONTROL_FLOW_OPS: frozenset[str] = frozenset(
    {"cond", "map_impl", "while_loop", "scan", "wrap_with_set_grad_enabled", "wrap_with_autocast"}
)


def _runs_subgraphs(user: fx.Node) -> bool:
    target = user.target
    return (
        user.op == "call_function"
        and isinstance(target, torch._ops.HigherOrderOperator)
        and target.name() in CONTROL_FLOW_OPS
    )


def _subgraph(gm: fx.GraphModule, node: fx.Node) -> fx.GraphModule | None:
    if node.op != "get_attr" or not any(_runs_subgraphs(u) for u in node.users):
        return None
    mod: object = gm
    for part in str(node.target).split("."):
        mod = getattr(mod, part, None)
    return mod if isinstance(mod, fx.GraphModule) else None


def control_flow_subgraphs(gm: fx.GraphModule) -> Iterator[tuple[str, fx.GraphModule]]:
    """Every control-flow subgraph below ``gm`` (see the module's note), nested ones
    included, each once, as ``(dotted path from gm, module)``; outer before inner."""
    seen = {id(gm)}
    stack = [("", gm)]
    while stack:
        prefix, module = stack.pop()
        found = []
        for node in module.graph.find_nodes(op="get_attr"):
            sub = _subgraph(module, node)
            if sub is not None and id(sub) not in seen:
                seen.add(id(sub))
                found.append((f"{prefix}{node.target}", sub))
        yield from found
        stack.extend((f"{path}.", sub) for path, sub in reversed(found))
