"""Provenance of the nodes an edit creates: torch's ``from_node`` records and fxpass's own.

* ``from_node``: torch's provenance list (:class:`torch.fx.traceback.NodeSource`, one per
  replaced node, action ``replace``), as torch's own passes record it;
* ``fxpass_provenance``: ``{"rule", "pass", "replaced", "location"}``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from torch.fx import Node
from torch.fx.traceback import NodeSource, NodeSourceAction

__all__ = ["COPIED_META", "node_sources", "provenance_record"]

#: Metadata keys a new node inherits from the node it replaces.
COPIED_META = ("stack_trace", "nn_module_stack", "source_fn_stack", "torch_fn")

_TARGET_NAMES: dict[int, tuple[Any, str]] = {}  # id(target) -> (target, str(target))


def node_sources(old: Sequence[Node], pass_name: str) -> list[NodeSource]:
    """torch ``NodeSource`` records (action ``replace``) for the replaced nodes.

    Built without ``NodeSource``'s deep copy of the old node's history: the history's
    records are shared, which is safe because nothing edits a recorded ``NodeSource``.
    """
    out = []
    new = object.__new__
    info_cls = NodeSource.NodeInfo
    replace = NodeSourceAction.REPLACE
    names = _TARGET_NAMES
    for n in old:
        target = n.target
        text = names.get(id(target))
        if text is None or text[0] is not target:
            text = names[id(target)] = (target, str(target))
        info = new(info_cls)
        info.__dict__ = {"name": n.name, "target": text[1], "graph_id": id(n.graph)}
        src = new(NodeSource)
        src.__dict__ = {
            "pass_name": pass_name,
            "action": [replace],
            "node_info": info,
            "from_node": list(n.meta.get("from_node", ())),
            "_action_string": None,
            "_dict": None,
        }
        out.append(src)
    return out


def provenance_record(
    rule: str, pass_name: str, replaced: Iterable[str], location: str
) -> dict[str, Any]:
    """``meta['fxpass_provenance']`` of a new node: the rule and the pass that made it, the
    names of the nodes it replaced, and where the rule is written."""
    return {"rule": rule, "pass": pass_name, "replaced": list(replaced), "location": location}
