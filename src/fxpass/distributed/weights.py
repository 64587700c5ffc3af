"""Where a weight node's tensor lives, read and replaced: a ``get_attr``'s attribute of the
graph module, or the state of the program the run works on (``PassContext.program``: a
parameter, buffer or constant placeholder of an ExportedProgram).

A graph whose weights are inputs (an AOT graph inside ``torch.compile``) has no tensor
for them: :func:`current_weight` is None there, and the rewrites slice them in the graph.
:class:`Replaced` remembers what it replaced, so a failed rewrite puts every tensor back.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

from ..fxutil.paths import find_path

__all__ = ["Replaced", "current_weight", "replace_weight"]


def current_weight(gm: fx.GraphModule, node: fx.Node, program: Any) -> torch.Tensor | None:
    """The tensor behind a weight node: a ``get_attr``, or a parameter of ``program`` (the
    run's ``PassContext.program``)."""
    if node.op == "get_attr":
        value = find_path(gm, str(node.target))
        return value if isinstance(value, torch.Tensor) else None
    return program.value(node) if program is not None else None


def _home(gm: fx.GraphModule, node: fx.Node, program: Any) -> tuple[Any, str, bool] | None:
    """(owner, key, is an attribute) of the place that holds ``node``'s tensor."""
    if node.op == "get_attr":
        owner_path, _, attr = str(node.target).rpartition(".")
        return (find_path(gm, owner_path) if owner_path else gm), attr, True
    spec = program.input_spec(node) if program is not None else None
    if spec is None or spec.target is None:
        return None
    store = program.state_dict if spec.target in program.state_dict else program.constants
    return store, spec.target, False


def _get(owner: Any, key: str, attr: bool) -> Any:
    return getattr(owner, key) if attr else owner[key]


def _put(owner: Any, key: str, attr: bool, value: Any) -> None:
    if attr:
        setattr(owner, key, value)
    else:
        owner[key] = value


def replace_weight(
    gm: fx.GraphModule, node: fx.Node, new: torch.Tensor, mode: Any, program: Any
) -> bool:
    """Put ``new`` where the graph keeps ``node``'s tensor (and its fake value in
    ``meta['val']``): a ``get_attr``'s attribute, or the state of ``program`` (the run's
    ``PassContext.program``) for a parameter; False when the graph has no tensor for it
    (its weights are inputs)."""
    home = _home(gm, node, program)
    if home is None:
        return False
    old = _get(*home)
    if isinstance(old, torch.nn.Parameter):
        new = torch.nn.Parameter(new, requires_grad=old.requires_grad)
    _put(*home, new)
    node.meta["val"] = mode.from_tensor(new, static_shapes=True)
    return True


class Replaced:
    """The tensors replaced on one graph, to put back when the rewrite fails, and their
    bytes (``before``: the tensors replaced, ``after``: what replaced them).

    >>> replaced = Replaced(gm, program)                         # doctest: +SKIP
    >>> replaced.replace(node, piece, mode)                      # doctest: +SKIP
    >>> replaced.restore()                 # every tensor (and meta['val']) as it was  # doctest: +SKIP
    """

    def __init__(self, gm: fx.GraphModule, program: Any) -> None:
        self.gm, self.program = gm, program
        self.before = self.after = 0
        self._old: list[tuple[Any, str, bool, Any]] = []

    def replace(self, node: fx.Node, new: torch.Tensor, mode: Any) -> bool:
        """:func:`replace_weight`, remembering the tensor it replaces."""
        home = _home(self.gm, node, self.program)
        if home is None:
            return False
        old = _get(*home)
        self._old.append((*home, old))
        self.before += old.numel() * old.element_size()
        self.after += new.numel() * new.element_size()
        return replace_weight(self.gm, node, new, mode, self.program)

    def restore(self) -> None:
        for owner, key, attr, old in reversed(self._old):
            _put(owner, key, attr, old)
        self._old.clear()
