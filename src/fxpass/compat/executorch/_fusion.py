"""ExecuTorch's partition fusion with one recompile and no graph copies, for
:func:`~fxpass.compat.executorch.install`.

``to_backend`` fuses each partition a partitioner tagged into a submodule
(``create_submodule_from_nodes``), and after each one re-sorts the whole program's graph
(torch's ``legalize_graph``): it copies every node into a new graph in a breadth-first
topological order, then sets it on the module, which regenerates the Python code of the
program and of every submodule made so far. For a 16-layer decoder with 82 XNNPACK
partitions that is 97,000 node copies, 82 full recompiles and 3,403 submodule recompiles.

* :func:`legalize_graph` computes the same order (the same algorithm: Kahn's, first in first
  out, symbolic-size checks first) and puts the graph's own nodes in it, leaving the graph as
  the copy would be (:func:`~fxpass.fxutil.fx_internals.relink_as_copied`), then recompiles;
* :func:`one_recompile` runs ExecuTorch's loop over the partitions with the program's
  recompiles deferred (fxpass's :class:`~fxpass.core.recompile.DeferredRecompile`, as a
  pipeline run defers them) and regenerates the code once at the end; a call of the module
  in between regenerates it first.

The program built is ExecuTorch's, node for node, name for name.
"""

from __future__ import annotations

import collections
import functools
import operator
from collections.abc import Callable
from typing import Any

import torch
from torch import fx

from ...core.recompile import DeferredRecompile
from ...fxutil.fx_internals import relink_as_copied

__all__ = ["legalize_graph", "one_recompile"]

aten = torch.ops.aten

#: ops torch's legalize_graph puts first as soon as they are ready (runtime checks of
#: symbolic sizes come before the data-dependent ops that rely on them)
_FIRST = frozenset(
    (
        operator.add,
        operator.mul,
        operator.sub,
        operator.floordiv,
        operator.truediv,
        operator.mod,
        operator.le,
        operator.lt,
        operator.ge,
        operator.gt,
        operator.eq,
        operator.ne,
        aten.sym_constrain_range.default,
        aten.sym_constrain_range_for_size.default,
        aten._assert_async.msg,
        aten.scalar_tensor.default,
        aten._assert_scalar.default,
    )
)


def _legal_order(graph: fx.Graph) -> list[fx.Node]:
    """The order torch's ``legalize_graph`` copies ``graph``'s nodes in."""
    waiting = dict.fromkeys(graph.nodes, 0)
    for node in graph.nodes:
        for user in node.users:
            waiting[user] += 1
    ready = collections.deque(n for n, count in waiting.items() if count == 0)
    order = []
    while ready:
        node = ready.popleft()
        order.append(node)
        for user in node.users:
            waiting[user] -= 1
            if waiting[user] == 0:
                if user.op == "call_function" and user.target in _FIRST:
                    ready.appendleft(user)
                else:
                    ready.append(user)
    if len(order) < len(waiting):
        stuck = [n for n, count in waiting.items() if count != 0]
        raise RuntimeError(f"Input graph has cycles, unable to add {stuck}")
    return order


def legalize_graph(gm: fx.GraphModule) -> fx.GraphModule:
    """torch's ``legalize_graph`` (``torch.fx.passes.tools_common``) in place: ``gm``'s graph
    in the same topological order, with the same names and users, without copying a node.
    Recompiles ``gm`` (deferred inside :func:`one_recompile`)."""
    graph = gm.graph
    if not relink_as_copied(graph, _legal_order(graph)):
        from torch.fx.passes.tools_common import legalize_graph as copying

        return copying(gm)  # a copy would rename a node: let it
    gm.recompile()
    return gm


def one_recompile(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn(graph_module, ...)`` with ``graph_module``'s recompiles deferred to one at the end
    (also when ``fn`` raises: the module's code always matches its graph afterwards)."""

    @functools.wraps(fn)
    def run(graph_module: Any, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(graph_module, fx.GraphModule):
            return fn(graph_module, *args, **kwargs)
        recompiler = DeferredRecompile()
        recompiler.install(graph_module)
        try:
            return fn(graph_module, *args, **kwargs)
        finally:
            recompiler.finish()

    return run
