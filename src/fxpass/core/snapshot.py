"""Cheap, exact rollback of a GraphModule, and cheap detection of whether a pass changed it.

Copying a graph (``Graph.graph_copy``) costs about 0.4x a recompile and creates new Node
objects, so a restored copy is not the user's graph "node for node". Instead a
:class:`GraphSnapshot` journals the state of every existing node (its links, arguments,
users, metadata, name) and of the modules around the graph, and :meth:`GraphSnapshot.restore`
writes that state back into the very same objects. Nodes a pass created simply fall out of
the list; nodes it erased are re-linked.

Tensor *data* is not copied: a pass that edits a parameter in place cannot be undone, and
:meth:`GraphSnapshot.restore` says so by returning the names of such tensors.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

from ..fxutil.fx_internals import bind_owner, graph_structure, module_tables, own_graph
from ..fxutil.fx_state import GraphState

__all__ = ["GraphSnapshot", "fingerprint"]


class _ModuleState:
    __slots__ = ("attrs", "buffers", "module", "modules", "non_persistent", "parameters")

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module
        self.attrs = dict(module.__dict__)
        modules, parameters, buffers, non_persistent = module_tables(module)
        self.modules = dict(modules)
        self.parameters = dict(parameters)
        self.buffers = dict(buffers)
        self.non_persistent = set(non_persistent)

    def restore(self) -> None:
        m = self.module
        m.__dict__.clear()
        m.__dict__.update(self.attrs)
        saved = (self.modules, self.parameters, self.buffers, self.non_persistent)
        for live, kept in zip(module_tables(m), saved):
            live.clear()
            live.update(kept)


# Attributes recompile() sets on a GraphModule's own per-instance class.
_CODE_CLASS_ATTRS = ("forward", "_wrapped_call", "__call__")


class GraphSnapshot:
    """The state of a GraphModule (and of the graphs and modules inside it), restorable.

    >>> snap = GraphSnapshot.take(gm)      # doctest: +SKIP
    >>> ...                                # any pass edits gm, then raises  # doctest: +SKIP
    >>> snap.restore()                     # gm is node for node what it was  # doctest: +SKIP
    """

    __slots__ = ("_classes", "_graphs", "_states", "_versions", "gm")

    def __init__(self, gm: torch.nn.Module, *, graphs: bool = True) -> None:
        self.gm = gm
        modules = list(gm.modules())
        self._states = [_ModuleState(m) for m in modules]
        self._graphs: list[GraphState] = []
        if graphs:
            self.take_graphs()
        self._classes = [
            (cls, {a: cls.__dict__[a] for a in _CODE_CLASS_ATTRS if a in cls.__dict__})
            for cls in {type(m) for m in modules if isinstance(m, fx.GraphModule)}
        ]
        self._versions = {
            name: (t, t._version) for name, t in _named_tensors(gm) if not _is_fake(t)
        }

    @classmethod
    def take(cls, gm: torch.nn.Module, *, graphs: bool = True) -> GraphSnapshot:
        """Journal ``gm`` so that :meth:`restore` can put it back (without ``graphs``: its
        modules, tables and code only, the graphs left to the editor's journal until
        :meth:`take_graphs`)."""
        return cls(gm, graphs=graphs)

    @property
    def has_graphs(self) -> bool:
        return bool(self._graphs)

    def take_graphs(self) -> None:
        """Add every node of every graph in the module, as it is now (a whole-graph copy of
        the nodes' state: for a pass that edits outside the editor)."""
        self._graphs = [
            GraphState(graph)
            for m in self.gm.modules()
            if isinstance(m, fx.GraphModule) and (graph := own_graph(m)) is not None
        ]

    def restore(self) -> list[str]:
        """Put the module back as it was; return names of tensors edited in place (not undone)."""
        for state in self._states:
            state.restore()
        for state in self._graphs:
            state.restore()
            owner = state.graph.owning_module
            if owner is not None and own_graph(owner) is not state.graph:
                state.graph.owning_module = None
        for m in self.gm.modules():
            if isinstance(m, fx.GraphModule):
                bind_owner(m)
        for cls, attrs in self._classes:
            for name, value in attrs.items():
                setattr(cls, name, value)
        return [name for name, (t, version) in self._versions.items() if t._version != version]


def _named_tensors(gm: torch.nn.Module):
    seen: set[int] = set()
    for name, t in [*gm.named_parameters(), *gm.named_buffers()]:
        if id(t) not in seen:
            seen.add(id(t))
            yield name, t


def _is_fake(t: torch.Tensor) -> bool:
    return isinstance(t, torch._subclasses.FakeTensor) or t.device.type == "meta"


def fingerprint(gm: torch.nn.Module) -> Any:
    """A value that compares equal exactly when the graph's structure is unchanged.

    It holds every node with its name, target and (identical or equal) arguments, so comparing
    two fingerprints is one C-level list comparison. Metadata edits do not count as changes.
    """
    graph = gm.graph
    return (
        id(graph),
        graph_structure(graph),
        *(tuple(table) for table in module_tables(gm)[:3]),
    )


def same_fingerprint(a: Any, b: Any) -> bool:
    """Compare fingerprints; a comparison that cannot decide (tensor arguments) counts as changed."""
    try:
        return bool(a == b)
    except Exception:  # broad: as documented, a comparison that cannot decide means changed
        return False
