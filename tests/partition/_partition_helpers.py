"""Shared by the partition tests: exported decoders, their flat inputs, random DAGs."""

from __future__ import annotations

import operator

import torch
from hypothesis import strategies as st
from torch import fx
from torch.export.graph_signature import InputKind

import _models

SUPPORT = "elementwise | norm"


def flat_args(ep: torch.export.ExportedProgram, inputs) -> list:
    """The arguments ``ep.graph_module`` takes: parameters, buffers and user inputs in order."""
    user = iter(inputs)
    out = []
    for spec in ep.graph_signature.input_specs:
        if spec.kind == InputKind.USER_INPUT:
            out.append(next(user))
        elif spec.target in ep.state_dict:
            out.append(ep.state_dict[spec.target])
        else:
            out.append(ep.constants[spec.target])
    return out


def exported_with_args(**cfg):
    """A fresh exported decoder (asserts kept), its flat args, and the graph's outputs."""
    ep = _models.exported(**cfg)
    args = flat_args(ep, _models.decoder(**cfg).example_inputs())
    return ep, args, ep.graph_module(*args)


def name_sets(parts) -> list[frozenset[str]]:
    return sorted((frozenset(n.name for n in getattr(p, "nodes", p)) for p in parts), key=sorted)


def is_supported_add(node: fx.Node) -> bool:
    return node.op == "call_function" and node.target in (operator.add, operator.sub)


@st.composite
def random_dags(draw, max_nodes: int = 40) -> fx.GraphModule:
    """A DAG of ``add``/``sub`` (supported) and ``mul`` (not) over two inputs.

    Edges mostly go to recent nodes (as in real graphs) and sometimes far back; every node
    without users is returned.
    """
    count = draw(st.integers(2, max_nodes))
    graph = fx.Graph()
    nodes = [graph.placeholder("x"), graph.placeholder("y")]
    for _ in range(count):
        pool = nodes[-6:] if draw(st.booleans()) else nodes
        a = draw(st.sampled_from(pool))
        b = draw(st.sampled_from(nodes))
        op = draw(st.sampled_from([operator.add, operator.add, operator.sub, operator.mul]))
        nodes.append(graph.call_function(op, (a, b)))
    graph.output(tuple(n for n in nodes if not n.users and n.op != "placeholder") or nodes[-1])
    return fx.GraphModule(torch.nn.Module(), graph)
