"""Models the tests share: exported once per session, handed out as fresh copies.

Exporting takes seconds, so every capture here is cached; tests get a deep copy they may
mutate freely.
"""

from __future__ import annotations

import functools

import torch

from fxpass.fxutil.fx_internals import copy_sharing_specs  # deepcopy without LeafSpec warnings
from fxpass.models.llama import DecoderConfig, build_decoder

ASSERT = torch.ops.aten._assert_tensor_metadata.default


@functools.cache
def decoder(**overrides) -> torch.nn.Module:
    return build_decoder(DecoderConfig(**overrides))


@functools.cache
def _exported(decompose: bool, **overrides):
    model = decoder(**overrides)
    ep = torch.export.export(model, model.example_inputs())
    return ep.run_decompositions() if decompose else ep


def exported(*, decompose: bool = True, **overrides) -> torch.export.ExportedProgram:
    """A fresh copy of the exported decoder (core ATen when ``decompose``), asserts kept."""
    return copy_sharing_specs(_exported(decompose, **overrides))


def exported_gm(*, decompose: bool = True, remove_asserts: bool = False, **overrides):
    """A fresh GraphModule of the exported decoder; optionally without export's asserts."""
    gm = exported(decompose=decompose, **overrides).graph_module
    if remove_asserts:
        for node in list(gm.graph.nodes):
            if node.target is ASSERT:
                gm.graph.erase_node(node)
        gm.recompile()
    return gm


def lifted_inputs(ep: torch.export.ExportedProgram) -> list[torch.Tensor]:
    """The parameters, buffers and constants an exported graph takes before the user inputs."""
    sig = ep.graph_signature
    out = []
    for spec in sig.input_specs:
        if spec.kind == torch.export.graph_signature.InputKind.USER_INPUT:
            continue
        source = ep.state_dict if spec.target in ep.state_dict else ep.constants
        out.append(source[spec.target])
    return out


def count(gm: torch.fx.GraphModule, target) -> int:
    """How many call_function nodes call ``target``."""
    return sum(1 for n in gm.graph.nodes if n.op == "call_function" and n.target is target)


class LinearRelu(torch.nn.Module):
    """The smallest model with a weight, a call and a scalar: ``relu(linear(x)) * 2`` on (2, 4)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
        return torch.relu(self.linear(x)) * 2
