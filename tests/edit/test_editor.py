"""new_node_meta: the metadata and provenance a library pass gives a node it creates."""

from __future__ import annotations

import torch
from torch.fx.traceback import NodeSource, NodeSourceAction

import fxpass as fp
from fxpass.edit.editor import Editor, new_node_meta


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
    assert prov["location"].startswith("test_editor.py:")


class _Events(fp.Instrumentation):
    def __init__(self):
        self.events = []

    def on_change(self, event, ctx):
        self.events.append(event)


def _twice_relu(x):
    return torch.relu(x) + torch.relu(x)


def test_a_library_pass_edits_through_the_editor_which_names_the_passs_line():
    gm = torch.fx.symbolic_trace(_twice_relu)
    seen = _Events()
    fp.Pipeline(["cse"]).run(gm, instrument=[seen])
    (event,) = seen.events
    assert event.kind == "replace" and event.rule == "cse"
    assert event.location.startswith("cse.py:")  # the pass, not a helper of the editor


def test_the_editor_asks_the_debug_counter_before_each_change():
    gm = torch.fx.symbolic_trace(_twice_relu)
    before = len(gm.graph.nodes)
    fp.Pipeline(["cse"]).run(gm, debug_counter=fp.DebugCounter(count=0))
    assert len(gm.graph.nodes) == before
    assert Editor(None).allow() and Editor(None).pass_name == "rewrite"
