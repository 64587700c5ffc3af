"""Small helpers on modules and graphs shared across fxpass."""

from __future__ import annotations

from torch import fx

__all__ = ["release_name"]


def release_name(graph: fx.Graph, name: str) -> None:
    """Let a node of ``graph`` take ``name`` again (``node._rename(name)``).

    Erased nodes keep their names reserved in the graph's namespace; this releases one
    (best effort on torch's private state)."""
    namespace = getattr(graph, "_graph_namespace", None)
    used = getattr(namespace, "_used_names", None)
    if isinstance(used, set):
        used.discard(name)
