"""Seeing edits that do not go through the editor: a handler that edits the graph itself.

Some code fxpass runs edits a graph directly (an Inductor pattern's handler calls
``graph.call_function`` and ``graph.erase_node``); the editor cannot ask or tell for it. Whoever
runs such code watches the graph while it runs, with :func:`watch_edits`, and then tells the
run what changed through its editor (``editor.notify``), as one change.

>>> with watch_edits(graph, made.append, gone.append):   # doctest: +SKIP
...     handler(match, graph, node)
>>> editor.notify("replace", "handler", gone, made)      # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from torch import fx

__all__ = ["watch_edits"]


@contextlib.contextmanager
def watch_edits(
    graph: fx.Graph,
    on_create: Callable[[fx.Node], object],
    on_erase: Callable[[fx.Node], object],
) -> Iterator[None]:
    """Call ``on_create(node)`` for each node made in ``graph`` inside the block and
    ``on_erase(node)`` for each node erased from it, whoever makes or erases them.

    On a graph owned by a GraphModule the calls come as the edits happen (torch's node
    hooks: ``on_erase`` sees the node before it is taken out, arguments intact), nodes
    made and erased inside the block included. A graph with no owning module has no hooks:
    its nodes are compared before and after the block instead, so the calls come at the end,
    ``on_erase`` sees nodes already erased, and a node made and erased inside the block is
    not seen.
    """
    owner = graph.owning_module
    add = getattr(owner, "_register_create_node_hook", None)
    if add is not None and hasattr(owner, "_register_erase_node_hook"):
        # torch calls the hooks of the graph's owner, which a copied graph may not be
        owner._register_create_node_hook(on_create)
        owner._register_erase_node_hook(on_erase)
        try:
            yield
        finally:
            owner._unregister_create_node_hook(on_create)
            owner._unregister_erase_node_hook(on_erase)
        return
    before = list(graph.nodes)
    yield
    after = graph.nodes
    known = set(before)
    for n in after:
        if n not in known:
            on_create(n)
    now = set(after)
    for n in before:
        if n not in now:
            on_erase(n)
