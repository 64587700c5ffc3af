"""ExecuTorch's partition fusion under install(): legalize_graph without copies, one recompile.

fxpass's ``legalize_graph`` must leave a graph exactly as torch's copying one does — node order,
names, each node's users in order, the names new nodes get, ``find_nodes`` — on the graphs
ExecuTorch fuses partitions in (an Edge program with a fused submodule, symbolic sizes).
"""

from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("executorch.exir")

from _executorch_helpers import edge_program
from executorch.exir import lowered_backend_module
from torch import fx
from torch.fx.passes.tools_common import legalize_graph as torch_legalize_graph
from torch.fx.passes.utils.fuser_utils import fuse_as_graphmodule, insert_subgm

from fxpass.compat.executorch._fusion import legalize_graph, one_recompile


def _state(gm: fx.GraphModule) -> tuple:
    graph = gm.graph
    nodes = [(n.name, n.op, str(n.target), str(n.args)) for n in graph.nodes]
    users = [[u.name for u in n.users] for n in graph.nodes]
    tables = {
        (op, str(target)): [n.name for n in graph.find_nodes(op=op, target=target, sort=False)]
        for op, target in {
            (n.op, n.target if n.op == "call_function" else None) for n in graph.nodes
        }
    }
    new = [graph.create_node("call_function", torch.ops.aten.relu.default, ()) for _ in range(3)]
    names = [n.name for n in new]
    for n in new:
        graph.erase_node(n)
    return nodes, users, tables, names, graph._codegen


def _fused(name: str, pick) -> fx.GraphModule:
    """An Edge program's graph with the nodes ``pick`` chooses fused into a submodule, the way
    ExecuTorch's ``create_submodule_from_nodes`` does before it legalizes."""
    gm = edge_program(name).graph_module
    nodes = [n for n in gm.graph.nodes if pick(n)]
    sub, inputs, outputs = fuse_as_graphmodule(gm, nodes, "fused_tag0")
    insert_subgm(gm, sub, inputs, outputs)
    for n in reversed(nodes):
        gm.graph.erase_node(n)
    return gm


@pytest.mark.parametrize(
    "name, pick",
    [
        ("add_relu", lambda n: n.op == "call_function" and "relu" in n.name),
        ("dynamic", lambda n: n.op == "call_function" and "add" in n.name),  # sym_size
        ("constant", lambda n: n.op == "call_function" and "mul" in n.name),
        ("sym_mul", lambda n: n.op == "call_function" and "relu" in n.name),  # operator.mul
    ],
)
def test_legalize_graph_leaves_the_graph_torchs_copy_leaves(name, pick):
    gm = _fused(name, pick)
    theirs, ours = copy.deepcopy(gm), gm
    graph_before = ours.graph
    torch_legalize_graph(theirs)
    legalize_graph(ours)
    assert ours.graph is graph_before  # in place: the same graph, the same node objects
    assert _state(ours)[:4] == _state(theirs)[:4]
    assert ours.code == theirs.code


def _out_of_order(name: str) -> fx.GraphModule:
    gm = edge_program(name).graph_module
    nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
    next(iter(gm.graph.nodes)).prepend(nodes[-1])  # a use before its definition
    return gm


@pytest.mark.parametrize("name", ["add_relu", "sym_mul"])
def test_legalize_graph_sorts_a_graph_out_of_order_and_reports_cycles(name):
    gm, theirs = _out_of_order(name), _out_of_order(name)
    torch_legalize_graph(theirs)
    legalize_graph(gm)
    assert _state(gm)[:4] == _state(theirs)[:4]
    gm.graph.lint()

    a = next(n for n in gm.graph.nodes if n.op == "call_function" and n.users)
    b = next(iter(a.users))
    a.args = (b, *a.args[1:])  # b reads a, and now a reads b: a cycle
    with pytest.raises(RuntimeError, match="Input graph has cycles"):
        legalize_graph(gm)


def test_executorchs_fusion_builds_the_same_graph_with_fxpass_legalize(monkeypatch):
    chain = {"aten_relu_default", "aten_add_tensor_1"}
    gm, other = edge_program("add_relu").graph_module, edge_program("add_relu").graph_module
    picked = [n for n in gm.graph.nodes if n.name in chain]
    other_picked = [n for n in other.graph.nodes if n.name in chain]
    lowered_backend_module.create_submodule_from_nodes(other, other_picked, "tag")
    monkeypatch.setattr(lowered_backend_module, "legalize_graph", legalize_graph)
    lowered_backend_module.create_submodule_from_nodes(gm, picked, "tag")
    assert _state(gm)[:4] == _state(other)[:4]
    assert gm.code == other.code


def test_one_recompile_defers_the_code_to_the_end_even_on_failure():
    gm = edge_program("add_relu").graph_module
    before = gm.code

    def edit(graph_module, fail):
        out = graph_module.graph.output_node()
        relu = next(n for n in graph_module.graph.nodes if n.name == "aten_relu_default")
        out.args = ((relu,),)
        graph_module.recompile()
        assert graph_module.code == before  # deferred
        if fail:
            raise ValueError("boom")
        return "done"

    assert one_recompile(edit)(gm, False) == "done"
    assert gm.code != before and "return (aten_relu_default,)" in gm.code
    assert "recompile" not in gm.__dict__  # the deferral is gone

    gm2 = edge_program("add_relu").graph_module
    with pytest.raises(ValueError, match="boom"):
        one_recompile(edit)(gm2, True)
    assert "return (aten_relu_default,)" in gm2.code
