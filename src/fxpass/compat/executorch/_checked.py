"""A manager's check is not run again on a program state it already passed.

ExecuTorch's ``ExportedProgramPassManager`` checks the program before and after its passes:
it regenerates the module's code, lints the graph and runs the program's verifiers (the Edge
verifier reads every node's ``meta['val']``). Its lowering calls a manager per pass (XNNPACK:
17 passes on each of 82 delegates of a 16-layer decoder, about 2,800 checks), so the check
before a call is usually the check after the previous one, on the same program, and a pass
that changed nothing is checked twice on the same state.

:func:`program_state` is everything the check reads: the graph's nodes (name, op, target,
arguments — as in fxpass's change detection) and the graphs of its submodules, the objects
in each node's ``val`` and ``torch_fn`` metadata, the signature, the state dict and
constants (names and tensor objects), the verifiers and the module call graph. The check
gives the same answer on the same state, so a state that passed once passes again.
"""

from __future__ import annotations

import weakref
from typing import Any

from torch import fx
from torch.export import ExportedProgram

__all__ = ["checked", "program_state", "remember_checked"]

# graph module -> (state, objects kept alive so that the ids in the state stay theirs). The
# state names nodes by name and holds no node or graph (they hold the module: it would never
# be freed).
_PASSED: weakref.WeakKeyDictionary[fx.GraphModule, tuple[tuple, tuple]] = (
    weakref.WeakKeyDictionary()
)


def _name(node: fx.Node) -> str:
    return node.name


def _graph_state(graph: fx.Graph) -> tuple:
    return tuple(
        (n.name, n.op, n.target, fx.node.map_arg(n.args, _name), fx.node.map_arg(n.kwargs, _name))
        for n in graph.nodes
    )


def program_state(program: ExportedProgram) -> tuple[tuple, tuple]:
    """What a manager's check of ``program`` depends on: ``(state, objects)``, where states
    compare equal when nothing the check reads changed, and ``objects`` keeps alive what the
    state holds by id."""
    graph_module = program.graph_module
    objects: list[Any] = [program.module_call_graph]
    graphs = []
    for name, module in graph_module.named_modules():
        if isinstance(module, fx.GraphModule):
            graphs.append((name, _graph_state(module.graph)))
    metadata = []
    for node in graph_module.graph.nodes:
        val, torch_fn = node.meta.get("val"), node.meta.get("torch_fn")
        metadata.append((id(val), id(torch_fn)))
        objects.extend((val, torch_fn))
    tensors = []
    for mapping in (program.state_dict, program.constants):
        tensors.append(tuple((k, id(v)) for k, v in mapping.items()))
        objects.extend(mapping.values())
    signature = program.graph_signature
    state = (
        tuple(graphs),
        tuple(metadata),
        tuple(signature.input_specs),
        tuple(signature.output_specs),
        tuple(tensors),
        tuple(program.verifiers),
        id(program.module_call_graph),
    )
    return state, tuple(objects)


def checked(program: ExportedProgram, state: tuple[tuple, tuple]) -> bool:
    """Whether the check already passed on ``program`` in this ``state``."""
    passed = _PASSED.get(program.graph_module)
    if passed is None:
        return False
    try:
        return bool(passed[0] == state[0])
    except Exception:  # broad: an argument that cannot be compared (tensors): check again
        return False


def remember_checked(program: ExportedProgram, state: tuple[tuple, tuple]) -> None:
    """The check passed on ``program`` in ``state``."""
    _PASSED[program.graph_module] = state
