"""A rank's rewrite as data, and the one executor that applies it.

A strategy works out what one rank changes without touching the graph: an
:class:`EditScript`, the edits (:mod:`.edits`: which arguments change, which values get
which collective, which weights keep which piece) by node name, with the rank's numbers in
them. :func:`apply_edits`, the one executor, checks that the graph has every node the script
names, then applies the edits in order (each makes itself: through the run's editor,
``ctx.editor`` — provenance, the report's change list, the debug counter, which counts each
collective edit as one change — and :mod:`.collectives`' builders), then the weights (where
the program keeps them, ``ctx.program``), then propagates ``meta['val']`` again once. A
script that names a node the graph lacks fails before any edit; an application that fails
leaves the graph and the weights as they were.

>>> script = EditScript([Reduce("linear_3", "0")], [SliceWeight("w", Shard(1), 0, 2)])  # doctest: +SKIP
>>> apply_edits(gm, script, ctx, "tensor_parallel")                 # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import fx

from ..core.snapshot import GraphSnapshot
from ..rewrite.metadata import fake_mode, repropagate
from .edits import Application, Cut, Edit
from .plan import PlanError

__all__ = ["EditScript", "apply_edits"]


@dataclass
class EditScript:
    """One rank's rewrite: the graph ``edits`` in order, then the ``weights`` cut."""

    edits: list[Edit] = field(default_factory=list)
    weights: list[Cut] = field(default_factory=list)

    def names(self) -> set[str]:
        """Every node the script names."""
        out: set[str] = set()
        for e in [*self.edits, *self.weights]:
            for f in e.named:
                name = getattr(e, f)
                out.update(name if isinstance(name, tuple) else () if name is None else (name,))
        return out


# ----- the executor -----------------------------------------------------------------------------
def apply_edits(gm: fx.GraphModule, script: EditScript, ctx: Any, rule: str) -> tuple[int, int]:
    """Apply ``script`` to ``gm`` through the run's editor (``ctx.editor``), cutting the
    weights of the program it runs on (``ctx.program``) under ``rule``; returns the bytes
    of the cut weights before and after. On a failure the graph and the weights are put
    back as they were and the error is raised again."""
    missing = sorted(script.names() - {n.name for n in gm.graph.nodes})
    if missing:
        raise PlanError(
            f"the rank's edits name node '{missing[0]}', which the graph does not have "
            "(were they made for another program?)"
        )
    at = Application(gm, ctx, rule)
    snapshot = GraphSnapshot.take(gm)
    try:
        for edit in script.edits:
            if not edit.counted or at.editor.allow():
                edit.apply_to(at)
        at.mode = fake_mode(gm)
        for weight in script.weights:
            weight.cut(at)
        repropagate(gm, at.mode, {at[w.node] for w in script.weights})
        gm.graph.lint()
    except BaseException:
        at.replaced.restore()
        snapshot.restore()
        raise
    return at.replaced.before, at.replaced.after
