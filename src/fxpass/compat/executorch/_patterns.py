"""XNNPACK's pattern graphs are built only for a graph that could hold one of them.

Two of XNNPACK's passes, run on every delegate, look for subgraphs by example:
``ConvertToUpsampleBilinear2d`` matches the graphs of ``bilinear_2d.get_graphs_dict()`` and
``ConvertToSDPAPass`` those of ``sdpa.get_graphs()``. Each getter builds its graphs the first
time it is asked, once per process, by exporting a small module (strict ``torch.export``)
and lowering it with ``to_edge`` — four bilinear upsamples and two attentions, about six
seconds of CPU, a tenth of the lowering of a 16-layer decoder that has neither.

``torch.fx``'s ``SubgraphMatcher`` matches every ``call_function`` node of a pattern to a
node of the graph with the same target (a pattern has no dead code, and these have one
output, which every node of the pattern feeds). So a graph that lacks one operator every
pattern of a pass holds has no match, whatever the patterns are otherwise. :data:`NEEDS`
names such operators for ExecuTorch |version| (the tests build the real patterns and check
that each holds them): the upsample itself for the bilinear patterns, which ExecuTorch keeps
whole; the masking and softmax ops of the decomposed attention for the SDPA patterns.

:func:`lazy_patterns` wraps a pass's ``call``: on a graph without one of the needed
operators (compared by name: a node whose target has the name is enough to build the
patterns), the pass runs with the getter answering "no patterns" (:func:`withheld`) — the
same loop over no matches it would have run — and the patterns are not built. On any other
graph it runs as ExecuTorch wrote it. With another ExecuTorch or torch release than the one
:data:`NEEDS` was checked on (:func:`known_release`), nothing is wrapped.

.. |version| replace:: 1.5 on torch 2.13
"""

from __future__ import annotations

import contextvars
import functools
import importlib.metadata
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

__all__ = ["NEEDS", "RELEASES", "Patterns", "known_release", "lazy_patterns", "withheld"]

#: (ExecuTorch, torch) release prefixes :data:`NEEDS` was checked on
RELEASES = (("1.5.", "2.13."),)

_PASSES = "executorch.backends.xnnpack._passes"
_GRAPHS = "executorch.backends.xnnpack.partition.graphs"


class Patterns(NamedTuple):
    """A pass that matches pattern graphs, and where it gets them."""

    cls: str  #: the pass class, in its module (a key of :data:`NEEDS`)
    graphs: str  #: the module of the patterns' getter
    getter: str  #: the getter's name there
    empty: type  #: what the getter answers when it has no patterns
    needs: frozenset[str]  #: operators (``EdgeOpOverload.__name__``) every pattern holds


#: pass module -> its patterns
NEEDS: dict[str, Patterns] = {
    f"{_PASSES}.convert_to_upsample_bilinear2d": Patterns(
        "ConvertToUpsampleBilinear2d",
        f"{_GRAPHS}.bilinear_2d",
        "get_graphs_dict",
        dict,
        frozenset({"aten.upsample_bilinear2d.vec"}),
    ),
    f"{_PASSES}.convert_to_sdpa": Patterns(
        "ConvertToSDPAPass",
        f"{_GRAPHS}.sdpa",
        "get_graphs",
        list,
        frozenset(
            {
                "aten._softmax.default",
                "aten.any.dim",
                "aten.eq.Scalar",
                "aten.full_like.default",
                "aten.logical_not.default",
                "aten.where.self",
            }
        ),
    ),
}

_WITHHELD: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "fxpass_executorch_patterns_withheld", default=False
)


def known_release(executorch: str | None = None, torch_version: str | None = None) -> bool:
    """Whether :data:`NEEDS` was checked on these releases (by default the installed ones)."""
    if executorch is None:
        try:
            executorch = importlib.metadata.version("executorch")
        except importlib.metadata.PackageNotFoundError:
            return False
    torch_version = torch.__version__ if torch_version is None else torch_version
    return any(executorch.startswith(et) and torch_version.startswith(tv) for et, tv in RELEASES)


def withheld(getter: Callable[[], Any], empty: type) -> Callable[[], Any]:
    """ExecuTorch's pattern ``getter``, answering ``empty()`` while a pass wrapped by
    :func:`lazy_patterns` runs on a graph none of the patterns can match."""

    @functools.wraps(getter)
    def patterns() -> Any:
        if _WITHHELD.get():
            return empty()
        return getter()

    patterns.__wrapped__ = getter
    return patterns


def _op_names(graph_module: torch.fx.GraphModule) -> set[str]:
    return {
        getattr(n.target, "__name__", "")
        for n in graph_module.graph.nodes
        if n.op == "call_function"
    }


def lazy_patterns(call: Callable[..., Any], needs: frozenset[str]) -> Callable[..., Any]:
    """A pass's ``call`` that does not build its patterns for a graph without ``needs``."""

    @functools.wraps(call)
    def run(self: Any, graph_module: torch.fx.GraphModule, *args: Any, **kwargs: Any) -> Any:
        if needs <= _op_names(graph_module):
            return call(self, graph_module, *args, **kwargs)
        token = _WITHHELD.set(True)
        try:
            return call(self, graph_module, *args, **kwargs)
        finally:
            _WITHHELD.reset(token)

    run.__wrapped__ = call
    return run
