"""new_node_meta: the metadata and provenance a library pass gives a node it creates."""

from __future__ import annotations

import pytest
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


def test_insert_set_args_replace_input_and_move_are_seen_by_the_run():
    gm = torch.fx.symbolic_trace(_twice_relu)
    seen = _Events()
    made = []

    def edit(gm):
        editor = Editor()
        x = next(n for n in gm.graph.nodes if n.op == "placeholder")
        first, second = [n for n in gm.graph.nodes if n.target is torch.relu]
        (add,) = [n for n in gm.graph.nodes if n.op == "call_function" and n not in (first, second)]
        neg = editor.insert(torch.neg, (x,), rule="neg", origin=[first], after=x)
        made.append(neg)
        editor.set_args(second, (neg,), rule="relu_of_neg")
        editor.replace_input(add, first, neg, rule="skip_relu")
        editor.erase(first, rule="dead")
        editor.move(neg, before=second, rule="closer")
        return True

    fp.Pipeline([edit]).run(gm, instrument=[seen])
    assert [e.kind for e in seen.events] == ["insert", "modify", "modify", "erase", "modify"]
    (neg,) = made
    assert (
        neg.meta["from_node"][0].name == "relu" and neg.meta["fxpass_provenance"]["rule"] == "neg"
    )
    x = torch.randn(5)
    torch.testing.assert_close(gm(x), torch.relu(-x) + (-x))


def test_insert_needs_one_anchor_and_an_origin():
    gm = torch.fx.symbolic_trace(_twice_relu)
    x = next(iter(gm.graph.nodes))
    editor = Editor(None)
    with pytest.raises(ValueError, match="exactly one of before= or after="):
        editor.insert(torch.neg, (x,), rule="r", origin=[x])
    with pytest.raises(ValueError, match="origin= must name at least one node"):
        editor.insert(torch.neg, (x,), rule="r", origin=[], after=x)


def test_a_debug_counter_bisects_inserted_nodes_like_rewrites():
    def add_negs(gm):
        editor = Editor()
        changed = False
        for node in [n for n in gm.graph.nodes if n.target is torch.relu]:
            if editor.allow():
                neg = editor.insert(torch.neg, (node,), rule="neg", origin=[node], after=node)
                for user in list(node.users):
                    if user is not neg:
                        editor.replace_input(user, node, neg, rule="neg")
                changed = True
        return changed

    gm = torch.fx.symbolic_trace(_twice_relu)
    fp.Pipeline([add_negs]).run(gm, debug_counter=fp.DebugCounter(count=1))
    assert sum(n.target is torch.neg for n in gm.graph.nodes) == 1
