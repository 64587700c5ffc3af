"""One list of graph forms (fxutil/graph_forms.py): every door's list is a spelling of it,
and each form's ``ops`` is what a graph of it calls (the writer: tests/edit/test_dialect_writer.py)."""

from __future__ import annotations

import operator

import _captures
import pytest
import torch

from fxpass.fxutil.graph_forms import FORMS, spelled
from fxpass.rewrite import traced
from fxpass.targets import backend
from fxpass.verify import testing

from _models import LinearRelu


def test_every_list_of_forms_spells_the_one_list():
    assert set(traced.IRS) <= set(FORMS)  # traced_rule speaks the forms' own names
    doors = {"backend": backend.IR_FORMS, "capture": testing.CAPTURE_FORMS}
    for door, forms in doors.items():
        assert all(f is FORMS[f.name] for f in forms.values()), door
    assert (
        tuple(backend.IR_FORMS) == backend.IRS and tuple(testing.CAPTURE_FORMS) == testing.CAPTURES
    )
    assert backend.IR_FORMS["aten"].name == "aot"  # the backend's passes see AOTAutograd's graphs
    assert testing.CAPTURE_FORMS["export"].name == "aten"  # capture(how="export") decomposes
    assert set(_captures.IRS) == {"export", "export_aten", "aot", "dynamo"}


def test_a_door_cannot_name_a_form_that_is_not_there():
    with pytest.raises(ValueError, match=r"not graph forms: \['mlir'\]"):
        spelled({"x": "mlir"})


def _calls(gm: torch.fx.GraphModule) -> set[str]:
    """What the graph's call nodes call: ``aten`` ops, ``edge`` ops or ``torch`` code."""
    kinds = set()
    for n in gm.graph.nodes:
        if n.op in ("call_module", "call_method"):
            kinds.add("torch")
        elif n.op == "call_function" and n.target is not operator.getitem:
            if type(n.target).__name__ == "EdgeOpOverload":
                kinds.add("edge")
            elif isinstance(n.target, torch._ops.OpOverload):
                kinds.add("aten")
            else:
                kinds.add("torch")
    return kinds


@pytest.mark.parametrize("how", testing.CAPTURES)
def test_each_form_calls_what_the_list_says(how):
    captured = testing.capture(LinearRelu(), (torch.randn(2, 4),), how)
    assert _calls(captured.graph_module) == {captured.form.ops}


def test_the_edge_form_calls_edge_ops():
    pytest.importorskip("executorch.exir")
    from executorch.exir import to_edge

    ep = to_edge(torch.export.export(LinearRelu(), (torch.randn(2, 4),))).exported_program()
    assert _calls(ep.graph_module) == {FORMS["edge"].ops}
