"""The default pipeline: the ``default`` pass list, which the demo, the backend and the CLI
run when given no spec. ``fxpass.registry.pass_list("default")`` edits it; the registered
pass ``default`` runs it as it stands."""

from __future__ import annotations

from ..core.registry import REGISTRY

DEFAULT_PASSES: list[str] = []

for _name in DEFAULT_PASSES:
    REGISTRY.pass_list("default").insert(_name)
