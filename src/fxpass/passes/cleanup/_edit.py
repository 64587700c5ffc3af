"""Small graph edits shared by the library passes: each asks the run's debug counter first,
tells instrumentation what changed, and gives new nodes their metadata and provenance."""

from __future__ import annotations

import inspect
import os
from collections.abc import Sequence
from typing import Any

from torch import fx

from ...core.context import ChangeEvent, current_context
from ...fxutil.dialect import edge_call, graph_is_edge, uses_dim_order
from ...rewrite.metadata import COPIED_META, node_sources, provenance_record

__all__ = [
    "Spelling",
    "allow",
    "erase",
    "fake_value",
    "new_node_meta",
    "notify",
    "replace_all_uses",
]


class Spelling:
    """How the new nodes of one graph call ops: in an ExecuTorch Edge graph, Edge ops (casts
    and clones as ExecuTorch's dim-order ops where the graph uses them); elsewhere the op.

    >>> target, args, kwargs = Spelling(gm.graph)(aten.clone.default, (x,), {})
    """

    def __init__(self, graph: fx.Graph) -> None:
        self.edge = graph_is_edge(graph.nodes)
        self.dim_order = self.edge and uses_dim_order(graph.nodes)

    def __call__(self, op: Any, args: tuple = (), kwargs: dict | None = None):
        kwargs = dict(kwargs or {})
        if not self.edge:
            return op, args, kwargs
        return edge_call(op, args, kwargs, dim_order=self.dim_order)


def allow() -> bool:
    """May the pass make one more change? (A debug counter may say no; outside a run: yes.)"""
    ctx = current_context()
    return ctx is None or ctx.allow()


def notify(kind: str, rule: str, old: Sequence[fx.Node] = (), new: Sequence[fx.Node] = ()) -> None:
    """Tell the run's instrumentation about one change."""
    ctx = current_context()
    if ctx is not None:
        ctx.notify(ChangeEvent(kind, rule, list(old), list(new), location=_caller()))


def _caller() -> str:
    frame = inspect.currentframe()
    here = os.path.dirname(__file__)
    while frame is not None and os.path.dirname(frame.f_code.co_filename) == here:
        frame = frame.f_back
    if frame is None:
        return ""
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"


def replace_all_uses(node: fx.Node, new: fx.Node, rule: str, *, erase_old: bool = True) -> None:
    """Point every user of ``node`` at ``new`` and (by default) erase ``node``."""
    node.replace_all_uses_with(new)
    notify("replace", rule, [node], [new])
    if erase_old and not node.users:
        node.graph.erase_node(node)


def erase(node: fx.Node, rule: str) -> None:
    """Erase a node that has no users."""
    notify("erase", rule, [node])
    node.graph.erase_node(node)


def new_node_meta(new: fx.Node, replaced: Sequence[fx.Node], rule: str, pass_name: str) -> None:
    """Give a node a pass created the metadata and provenance of the nodes it stands for."""
    first = replaced[0] if replaced else None
    if first is not None:
        for key in COPIED_META:
            if key in first.meta and key not in new.meta:
                new.meta[key] = first.meta[key]
    new.meta["from_node"] = node_sources(replaced, pass_name)
    new.meta["fxpass_provenance"] = provenance_record(
        rule, pass_name, [n.name for n in replaced], _caller()
    )


def fake_value(
    target: Any,
    args: Any,
    kwargs: Any,
    *,
    method: bool = False,
    like: Any = None,
    mode: Any = None,
    strict: bool = False,
) -> Any:
    """What ``target(*args, **kwargs)`` would return, computed on the nodes' example values
    in their fake mode (or ``like``'s, for calls without tensor arguments; or in ``mode``
    when one is given); None when an argument has no example value or the call fails —
    with ``strict``, those failures raise instead."""
    from torch._guards import detect_fake_mode

    from ._alias import node_val

    missing = []

    def val(n: fx.Node) -> Any:
        v = node_val(n)
        if v is None:
            missing.append(n)
        return v

    fargs, fkwargs = fx.node.map_arg((args, kwargs), val)
    if missing:
        if strict:
            names = ", ".join(f"'{n.name}'" for n in missing)
            raise ValueError(f"no example value (meta['val']) for the input(s) {names}")
        return None
    if mode is None:
        try:
            mode = detect_fake_mode((fargs, fkwargs, like))
        except AssertionError:  # example values from different fake modes
            if strict:
                raise
            return None
    if mode is None:
        from torch._subclasses.fake_tensor import FakeTensorMode

        mode = FakeTensorMode(allow_non_fake_inputs=True)
    try:
        with mode:
            if method:
                return getattr(fargs[0], target)(*fargs[1:], **fkwargs)
            return target(*fargs, **fkwargs)
    except Exception:  # an op the fake mode cannot run: the caller leaves the node alone
        if strict:
            raise
        return None
