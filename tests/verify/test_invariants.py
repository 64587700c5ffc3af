from __future__ import annotations

import pytest
import torch
from _verify_helpers import graph_and_inputs

import fxpass as fp
from fxpass.verify import MetadataError, check_metadata, require_metadata

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
