"""Editor.mark_new: the metadata and provenance a library pass gives a node it creates."""

from __future__ import annotations

import pytest
import torch
from torch.fx.traceback import NodeSource, NodeSourceAction

import fxpass as fp
from fxpass.edit.editor import Editor


def test_mark_new_records_what_torchs_node_source_records():
    gm = torch.fx.symbolic_trace(lambda x: x.relu())
    (old,) = [n for n in gm.graph.nodes if n.op == "call_method"]
    old.meta.update(stack_trace="here", nn_module_stack={"m": ("m", "M")}, keep="no")
    old.meta["from_node"] = [NodeSource(old, "earlier", NodeSourceAction.CREATE)]
    with gm.graph.inserting_after(old):
        new = gm.graph.call_function(torch.relu, (old,))
    new.meta["stack_trace"] = "mine"
    Editor(None, "a_pass").mark_new([new], [old], "rule")
    assert new.meta["from_node"] == [NodeSource(old, "a_pass", NodeSourceAction.REPLACE)]
    assert new.meta["stack_trace"] == "mine"  # what the node has already is kept
    assert new.meta["nn_module_stack"] == {"m": ("m", "M")} and "keep" not in new.meta
    prov = new.meta["fxpass_provenance"]
    assert prov["rule"] == "rule" and prov["pass"] == "a_pass" and prov["replaced"] == [old.name]
    assert prov["location"].startswith("test_editor.py:")


class _Events(fp.core.Instrumentation):
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
    fp.Pipeline(["cse"]).run(gm, debug_counter=fp.core.DebugCounter(count=0))
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
    fp.Pipeline([add_negs]).run(gm, debug_counter=fp.core.DebugCounter(count=1))
    assert sum(n.target is torch.neg for n in gm.graph.nodes) == 1


def test_a_change_of_several_edits_is_told_once_and_gives_its_new_nodes_provenance():
    gm = torch.fx.symbolic_trace(_twice_relu)
    seen = _Events()

    def fuse(gm):
        editor = Editor()
        first, second = [n for n in gm.graph.nodes if n.target is torch.relu]
        (add,) = [
            n for n in gm.graph.nodes if n.op == "call_function" and n.target not in (torch.relu,)
        ]
        assert editor.allow()
        with editor.change("replace", "double", [first, second, add]) as change:
            with gm.graph.inserting_before(add):
                made = editor.create(gm.graph, "call_function", torch.mul, (first, 2))
            editor.replace_all_uses(add, made, "double")
            editor.erase_all([second], "double")
        assert change.new == [made]
        return True

    fp.Pipeline([fuse]).run(gm, instrument=[seen])
    (event,) = seen.events
    assert event.kind == "replace" and event.rule == "double" and event.index == 1
    assert [n.name for n in event.old] == ["relu", "relu_1", "add"]
    (made,) = event.new
    assert [s.name for s in made.meta["from_node"]] == ["relu", "relu_1", "add"]
    assert made.meta["fxpass_provenance"]["pass"] == "fuse"
    assert event.location.startswith("test_editor.py:")
    x = torch.randn(3)
    torch.testing.assert_close(gm(x), torch.relu(x) * 2)


def test_a_change_that_raises_or_is_cancelled_tells_nobody():
    gm = torch.fx.symbolic_trace(_twice_relu)
    seen = _Events()

    def tries(gm):
        editor = Editor()
        x = next(n for n in gm.graph.nodes if n.op == "placeholder")
        with editor.change("insert", "cancelled", [x]) as change:
            neg = editor.insert(torch.neg, (x,), rule="neg", origin=[x], after=x)
            editor.erase(neg, "neg")
            change.cancel()
        with pytest.raises(RuntimeError), editor.change("insert", "raises", [x]):
            editor.insert(torch.neg, (x,), rule="neg", origin=[x], after=x)
            raise RuntimeError("the replacement failed")
        with editor.change("modify", "outer", [x]):  # an inner change is part of the outer
            with editor.change("modify", "inner", [x]) as inner:
                inner.cancel()
            editor.insert(torch.neg, (x,), rule="neg", origin=[x], after=x)
        return True

    fp.Pipeline([tries]).run(gm, instrument=[seen])
    assert [(e.rule, e.kind) for e in seen.events] == [("outer", "modify")]
    assert Editor(None)._open is None


def test_erase_all_erases_users_first_and_keeps_what_is_still_used():
    gm = torch.fx.symbolic_trace(lambda x: torch.relu(torch.neg(x)) + torch.neg(x).sin())
    nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
    neg, relu = nodes[0], nodes[1]
    seen = _Events()

    def erase(gm):
        Editor().replace_all_uses(relu, neg, "skip_relu", erase_old=False)
        gone = Editor().erase_all([neg, relu], "dead")
        assert gone == [relu]  # neg still has readers
        return True

    fp.Pipeline([erase]).run(gm, instrument=[seen])
    assert [e.kind for e in seen.events] == ["replace", "erase"] and seen.events[1].old == [relu]


def test_set_target_and_rename_are_told_as_modifications():
    gm = torch.fx.symbolic_trace(lambda x: torch.relu(x))
    seen = _Events()

    def retarget(gm):
        editor = Editor()
        (relu,) = [n for n in gm.graph.nodes if n.op == "call_function"]
        editor.set_target(relu, torch.neg, rule="neg")
        editor.rename(relu, "negated", rule="neg")
        return True

    fp.Pipeline([retarget]).run(gm, instrument=[seen])
    assert [e.kind for e in seen.events] == ["modify", "modify"]
    x = torch.randn(3)
    torch.testing.assert_close(gm(x), -x)
    assert "negated" in gm.code
