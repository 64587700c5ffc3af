"""One recompile per run: defer ``gm.recompile()`` while a pipeline runs.

Regenerating a GraphModule's Python code costs about 41 µs per node whatever changed, and
many passes (Torch-TensorRT's among them) call ``gm.recompile()`` after each edit. During a
run, :class:`DeferredRecompile` turns those calls into a note that the code is stale, and
:meth:`DeferredRecompile.finish` regenerates it once at the end. If anything calls the module
while its code is stale (a pass that executes it), the code is regenerated first, so the
module never runs stale code. A ``_LazyGraphModule`` (torch's lazily compiled module) stays
lazy: regenerating its code means marking it, and torch regenerates it when it is first run
or printed.
"""

from __future__ import annotations

from typing import Any

from torch import fx

from ..fxutil.fx import is_lazy_module

__all__ = ["DeferredRecompile"]


class DeferredRecompile:
    """Defers recompiles of the GraphModules handed to :meth:`install` until :meth:`finish`."""

    def __init__(self) -> None:
        self._graph_modules: dict[int, fx.GraphModule] = {}
        self._stale: dict[int, fx.GraphModule] = {}
        self.recompiles = 0
        self.deferred = 0

    def install(self, gm: Any) -> None:
        if not isinstance(gm, fx.GraphModule) or id(gm) in self._graph_modules:
            return
        self._graph_modules[id(gm)] = gm
        gm.__dict__["recompile"] = lambda: self._request(gm)

    def _request(self, gm: fx.GraphModule) -> Any:
        self.deferred += 1
        self.mark_stale(gm)

    def mark_stale(self, gm: Any) -> None:
        """Note that ``gm``'s code no longer matches its graph."""
        if not isinstance(gm, fx.GraphModule) or id(gm) in self._stale:
            return
        self.install(gm)
        self._stale[id(gm)] = gm

        def forward(*args: Any, **kwargs: Any) -> Any:
            self.ensure_code(gm)
            return gm.forward(*args, **kwargs)

        gm.__dict__["forward"] = forward

    def ensure_code(self, gm: Any) -> None:
        """Regenerate ``gm``'s code now if it is stale (for passes that run the module)."""
        if id(gm) in self._stale:
            del self._stale[id(gm)]
            gm.__dict__.pop("forward", None)
            self.recompiles += 1
            if is_lazy_module(gm):
                type(gm).recompile()  # a lazy module regenerates its code when first run
                return
            # GraphModule's own recompile: _LazyGraphModule (Dynamo) makes it a classmethod
            fx.GraphModule.recompile(gm)

    def finish(self, *, recompile: bool = True) -> None:
        """Stop deferring; regenerate stale code once (unless ``recompile`` is False)."""
        for gm in self._graph_modules.values():
            gm.__dict__.pop("recompile", None)
        if recompile:
            for gm in list(self._stale.values()):
                self.ensure_code(gm)
        for gm in self._stale.values():
            gm.__dict__.pop("forward", None)
        self._stale.clear()
        self._graph_modules.clear()
