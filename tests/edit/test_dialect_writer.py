"""The one node writer (edit/dialect_writer.py): what a pass creates and what the rewriter
respells call the same ops, Edge ops in an Edge graph."""

from __future__ import annotations

import pytest
import torch

from fxpass.edit.dialect_writer import Spelling
from fxpass.edit.editor import Editor

from _models import LinearRelu


def test_one_writer_spells_new_nodes_and_respells_replacements():
    """A node a pass creates and a node the rewriter respells call the same Edge op."""
    pytest.importorskip("executorch.exir")
    from executorch.exir import to_edge

    ep = to_edge(torch.export.export(LinearRelu(), (torch.randn(2, 4),))).exported_program()
    graph = ep.graph_module.graph
    spell = Spelling(graph)
    assert spell.edge and Spelling(torch.fx.symbolic_trace(LinearRelu()).graph).edge is False
    x = next(iter(graph.find_nodes(op="placeholder")))
    aten = torch.ops.aten
    written = [spell(op, (x,), {})[0] for op in (aten.clone.default, aten.neg.default)]
    out = next(iter(graph.find_nodes(op="output")))
    with graph.inserting_before(out):
        made = [graph.call_function(op, (x,)) for op in (aten.clone.default, aten.neg.default)]
    spell.respell(made, Editor(None), "test")
    assert [n.target for n in made] == written
    assert all(type(t).__name__ == "EdgeOpOverload" for t in written)
    assert str(written[0]) != str(aten.clone.default)  # dim-order clone, as ExecuTorch writes it
