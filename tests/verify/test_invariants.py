from __future__ import annotations

import pytest
import torch
from _verify_helpers import graph_and_inputs

import fxpass as fp
from fxpass.verify import (
    MetadataContractError,
    MetadataError,
    check_metadata,
    keeps_metadata,
    require_metadata,
)

aten = torch.ops.aten


def _drops_meta(gm: torch.fx.GraphModule) -> bool:
    """Insert neg(neg(x)) without metadata in front of the first mm."""
    node = next(n for n in gm.graph.nodes if n.target is aten.mm.default)
    with gm.graph.inserting_before(node):
        a = gm.graph.call_function(aten.neg.default, (node.args[0],))
        b = gm.graph.call_function(aten.neg.default, (a,))
    node.replace_input_with(node.args[0], b)
    return True


def test_exported_graphs_have_vals():
    gm, _ = graph_and_inputs()
    assert check_metadata(gm) == []
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    assert len(check_metadata(gm, ("no_such_key",), ops=["call_function"])) == len(calls)


def test_the_pass_that_drops_metadata_is_named():
    gm, inputs = graph_and_inputs()
    pipe = fp.Pipeline(["cse", _drops_meta]).add_checks(require_metadata("val"))
    with pytest.raises(fp.CheckFailedError) as info:
        pipe.run(gm, inputs)
    assert "after pass '_drops_meta'" in str(info.value)
    assert isinstance(info.value.cause, MetadataError)
    assert "2 nodes miss metadata: neg" in str(info.value.cause)
    assert check_metadata(gm) == []  # rolled back


def test_provenance_needs_from_node():
    gm, _ = graph_and_inputs()
    node = next(n for n in gm.graph.nodes if n.op == "call_function")
    node.meta["fxpass_provenance"] = {"rule": "r", "pass": "p", "replaced": [], "location": ""}
    node.meta.pop("from_node", None)
    assert check_metadata(gm) == [f"{node.name} (call_function {node.target}): missing from_node"]


# ----- what each pass declares it keeps ---------------------------------------------------------
def _negate_first_mm_input(gm, *, meta: bool, val=None):
    """Put neg() in front of the first mm, through the editor (``meta``: with the mm's
    source metadata and provenance) or bare; ``val``: what to record as its value."""
    mm = next(n for n in gm.graph.nodes if n.target is aten.mm.default)
    x = mm.args[0]
    if meta:
        neg = fp.current_context().editor.insert(
            aten.neg.default, (x,), rule="neg", origin=[mm], before=mm, val=val
        )
    else:
        with gm.graph.inserting_before(mm):
            neg = gm.graph.call_function(aten.neg.default, (x,))
        if val is not None:
            neg.meta["val"] = val
    mm.replace_input_with(x, neg)
    return neg


def _pass(keeps, **how):
    def negates(gm):
        mm = next(n for n in gm.graph.nodes if n.target is aten.mm.default)
        val = how.pop("val", "same")
        if val == "same":
            val = mm.args[0].meta["val"]
        elif val == "wrong":
            val = mm.args[0].meta["val"].t()
        _negate_first_mm_input(gm, val=val, **how)
        return True

    negates.keeps = keeps
    return negates


@pytest.mark.parametrize(
    ("keeps", "how", "problem"),
    [
        (
            "stack_trace",
            {"meta": False},
            "new node %neg_default (aten.neg.default) has no meta['stack_trace']",
        ),
        (
            "provenance",
            {"meta": False},
            "new node %neg_default (aten.neg.default) has no meta['from_node']",
        ),
        (
            "val",
            {"meta": True, "val": None},
            "new node %neg_default (aten.neg.default) has no meta['val']",
        ),
        (
            "val",
            {"meta": True, "val": "wrong"},
            "%neg_default (aten.neg.default) records shape [64, 8]",
        ),
        ("layouts", {"meta": True, "val": "wrong"}, "%neg_default (aten.neg.default) made by"),
    ],
)
def test_a_pass_that_breaks_what_it_keeps_is_named_with_the_node(keeps, how, problem):
    gm, inputs = graph_and_inputs()
    pipe = fp.Pipeline([_pass((keeps,), **how)]).add_checks(keeps_metadata())
    with pytest.raises(fp.CheckFailedError) as info:
        pipe.run(gm, inputs)
    first = str(info.value).splitlines()[0]
    assert first.startswith("check 'keeps_metadata' failed after pass 'negates': ")
    assert isinstance(info.value.cause, MetadataContractError)
    assert f"pass 'negates' keeps {keeps}, but {problem}" in first


def test_a_pass_that_keeps_its_promises_passes_and_one_that_promises_nothing_is_not_checked():
    gm, inputs = graph_and_inputs()
    keeps_all = _pass("all", meta=True)
    fp.Pipeline([keeps_all]).add_checks(keeps_metadata()).run(gm, inputs)
    fp.Pipeline([_pass((), meta=False, val=None)]).add_checks(keeps_metadata()).run(gm, inputs)


def test_a_pass_that_drops_a_nodes_metadata_is_named():
    def forgets(gm):
        node = next(n for n in gm.graph.nodes if n.target is aten.mm.default)
        fp.current_context().editor.set_args(node, node.args, rule="touch")
        del node.meta["nn_module_stack"]
        return True

    forgets.keeps = ("nn_module_stack",)
    gm, inputs = graph_and_inputs()
    with pytest.raises(
        fp.CheckFailedError,
        match=r"keeps nn_module_stack, but %mm \(aten.mm.default\) lost meta\['nn_module_stack'\]",
    ):
        fp.Pipeline([forgets]).add_checks(keeps_metadata()).run(gm, inputs)
