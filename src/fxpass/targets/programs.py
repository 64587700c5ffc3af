"""Building an ExportedProgram: the one place fxpass calls ``ExportedProgram(...)``.

:func:`build_program` makes a program of a graph module and its signature, state and
constants with ``ExportedProgram``'s own constructor, which validates it;
:func:`updated_program` is the same program after passes changed its graph (what
:func:`fxpass.targets.export.run_on_program` returns), and ``fxpass.distributed``'s pipeline
stages are built with :func:`build_program` too.
"""

from __future__ import annotations

from typing import Any

from torch import fx
from torch.export import ExportedProgram
from torch.export.graph_signature import ExportGraphSignature

from ..fxutil.fx_internals import copy_sharing_specs

__all__ = ["build_program", "module_call_graph", "updated_program"]


def build_program(
    gm: fx.GraphModule,
    signature: ExportGraphSignature,
    *,
    like: ExportedProgram,
    state_dict: dict[str, Any],
    constants: dict[str, Any],
    range_constraints: dict[Any, Any],
    module_call_graph: list[Any],
    example_inputs: Any = None,
) -> ExportedProgram:
    """A new ExportedProgram of ``gm``, with the verifiers of the program it comes from
    (``like``)."""
    return ExportedProgram(
        root=gm,
        graph=gm.graph,
        graph_signature=signature,
        state_dict=state_dict,
        range_constraints=range_constraints,
        module_call_graph=module_call_graph,
        example_inputs=example_inputs,
        constants=constants,
        verifiers=list(like.verifiers),
    )


def updated_program(
    ep: ExportedProgram,
    gm: fx.GraphModule,
    signature: ExportGraphSignature,
    state_dict: dict[str, Any],
    constants: dict[str, Any],
) -> ExportedProgram:
    """``ep`` after passes made ``gm`` of it: its range constraints and module call graph
    brought up to date, its example inputs kept."""
    from torch.export.exported_program import _get_updated_range_constraints

    return build_program(
        gm,
        signature,
        like=ep,
        state_dict=state_dict,
        constants=constants,
        range_constraints=_get_updated_range_constraints(gm, ep.range_constraints),
        module_call_graph=module_call_graph(ep, signature),
        example_inputs=ep.example_inputs,
    )


def module_call_graph(ep: ExportedProgram, signature: ExportGraphSignature) -> list[Any]:
    """``ep``'s module call graph with the root's input and output names brought up to
    date for ``signature``."""
    old_sig = ep.graph_signature
    rename = dict(zip(old_sig.user_inputs, signature.user_inputs))
    rename.update(zip(old_sig.user_outputs, signature.user_outputs))
    entries = copy_sharing_specs(ep.module_call_graph)
    for entry in entries:
        if entry.signature is None:
            continue
        for arg in [*entry.signature.inputs, *entry.signature.outputs]:
            if getattr(arg, "name", None) in rename and rename[arg.name] is not None:
                arg.name = rename[arg.name]
    return entries
