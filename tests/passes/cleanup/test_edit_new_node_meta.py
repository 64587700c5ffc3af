"""new_node_meta: the metadata and provenance a library pass gives a node it creates."""

from __future__ import annotations

import torch
from torch.fx.traceback import NodeSource, NodeSourceAction

from fxpass.passes.cleanup._edit import new_node_meta


def test_new_node_meta_records_what_torchs_node_source_records():
    gm = torch.fx.symbolic_trace(lambda x: x.relu())
    (old,) = [n for n in gm.graph.nodes if n.op == "call_method"]
    old.meta.update(stack_trace="here", nn_module_stack={"m": ("m", "M")}, keep="no")
    old.meta["from_node"] = [NodeSource(old, "earlier", NodeSourceAction.CREATE)]
    with gm.graph.inserting_after(old):
        new = gm.graph.call_function(torch.relu, (old,))
    new.meta["stack_trace"] = "mine"
    new_node_meta(new, [old], "rule", "a_pass")
    assert new.meta["from_node"] == [NodeSource(old, "a_pass", NodeSourceAction.REPLACE)]
    assert new.meta["stack_trace"] == "mine"  # what the node has already is kept
    assert new.meta["nn_module_stack"] == {"m": ("m", "M")} and "keep" not in new.meta
    prov = new.meta["fxpass_provenance"]
    assert prov["rule"] == "rule" and prov["pass"] == "a_pass" and prov["replaced"] == [old.name]
    assert prov["location"].startswith("test_edit_new_node_meta.py:")
