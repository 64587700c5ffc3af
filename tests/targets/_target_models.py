"""Models and passes the target tests share: captured once, handed out as fresh copies."""

from __future__ import annotations

import copy
import functools

import torch

from fxpass.edit.editor import Editor
from fxpass.models.convnet import build_convnet
from fxpass.targets.export import add_constant, value_of

aten = torch.ops.aten


@functools.cache
def convnet(**overrides) -> torch.nn.Module:
    return build_convnet(**overrides)


@functools.cache
def _convnet_ep(decompose: bool, **overrides) -> torch.export.ExportedProgram:
    model = build_convnet(**overrides)
    ep = torch.export.export(model, model.example_inputs())
    return ep.run_decompositions() if decompose else ep


def convnet_ep(*, decompose: bool = True, **overrides) -> torch.export.ExportedProgram:
    """A fresh copy of the exported conv net (core ATen when ``decompose``)."""
    return copy.deepcopy(_convnet_ep(decompose, **overrides))


def fold_param_permute(gm: torch.fx.GraphModule) -> bool:
    """Fold ``permute(weight)`` of a constant weight into a new constant (a folded weight)."""
    changed = False
    for node in list(gm.graph.nodes):
        if node.target is not aten.permute.default:
            continue
        value = value_of(gm, node.args[0])
        if value is None:
            continue
        folded = value.detach().permute(*node.args[1]).contiguous()
        const = add_constant(gm, f"{node.args[0].name}_folded", folded, origin=[node])
        Editor().replace_all_uses(node, const, "fold_param_permute")
        changed = True
    return changed


def remove_unused_inputs(gm: torch.fx.GraphModule) -> bool:
    """Erase placeholders nobody reads (e.g. a weight after folding)."""
    unused = [n for n in gm.graph.nodes if n.op == "placeholder" and not n.users]
    for node in unused:
        gm.graph.erase_node(node)
    return bool(unused)


def graph_state(ep: torch.export.ExportedProgram) -> tuple:
    """What must not change when a pass on ``ep`` fails or ``ep`` is only read."""
    return (
        str(ep.graph),
        str(ep.graph_signature),
        sorted(ep.state_dict),
        sorted(ep.constants),
    )


def rsqrt_to_reciprocal_sqrt(gm: torch.fx.GraphModule) -> bool:
    """rsqrt(x) -> reciprocal(sqrt(x)), in ATen graphs and in Dynamo's torch-level graphs.

    A real rewrite that every IR keeps until then (Inductor does not decompose rsqrt), so
    tests can see that a pipeline ran where it should."""
    import fxpass as fp

    spellings = {
        aten.rsqrt.default: (aten.sqrt.default, aten.reciprocal.default),
        torch.rsqrt: (torch.sqrt, torch.reciprocal),
    }
    changed = False
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in spellings:
            continue
        sqrt, reciprocal = spellings[node.target]
        with gm.graph.inserting_before(node):
            root = gm.graph.call_function(sqrt, (node.args[0],))
            inv = gm.graph.call_function(reciprocal, (root,))
        for new in (root, inv):
            new.meta.update({k: v for k, v in node.meta.items() if k != "val"})
        node.replace_all_uses_with(inv)
        gm.graph.erase_node(node)
        fp.stat("rsqrt_rewritten")
        changed = True
    return changed
