"""Inputs to run a program on: made from the placeholders' ``meta['val']`` (seeded, in
bounds for indexing ops), an ExportedProgram's own example inputs, or the flat inputs of its
graph (parameters, buffers, constants and user inputs in the signature's order)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import fx
from torch.utils import _pytree as pytree

__all__ = ["output_names", "program_inputs", "sample_args", "sample_inputs_from_meta"]

_INDEXING = {
    torch.ops.aten.embedding.default: (1, 0, 0),  # (arg holding indices, table arg, its dim)
}


def sample_inputs_from_meta(gm: fx.GraphModule, *, seed: int = 0) -> list[Any]:
    """Make inputs for every placeholder of ``gm`` from its ``meta['val']`` (seeded).

    Floating tensors are standard normal, booleans random, integer tensors random in a range
    that keeps indexing ops in bounds (an embedding's table size), symbolic sizes take their
    hints. Placeholders without ``meta['val']`` are an error that says so.
    """
    gen = torch.Generator().manual_seed(seed)
    inputs = []
    for node in gm.graph.find_nodes(op="placeholder"):
        if "val" not in node.meta:
            raise ValueError(
                f"placeholder '{node.name}' has no meta['val'], so no sample input can be made "
                "for it; pass sample inputs explicitly"
            )
        inputs.append(_make_value(node.meta["val"], _int_bound(node), gen))
    return inputs


def _int_bound(node: fx.Node) -> int:
    bounds = []
    for user in node.users:
        spec = _INDEXING.get(user.target)
        if spec and len(user.args) > spec[0] and user.args[spec[0]] is node:
            table = user.args[spec[1]]
            val = table.meta.get("val") if isinstance(table, fx.Node) else None
            if val is not None:
                bounds.append(_hint(val.shape[spec[2]]))
    return max(min(bounds, default=16), 1)


def _hint(size: Any) -> int:
    if isinstance(size, int):
        return size
    try:
        from torch.fx.experimental.symbolic_shapes import hint_int

        return int(hint_int(size, fallback=4))
    except Exception:  # broad: a size with no hint, however it fails, gets the same fallback
        return 4


def _make_value(val: Any, bound: int, gen: torch.Generator) -> Any:
    if isinstance(val, torch.Tensor):
        shape = [_hint(s) for s in val.shape]
        dtype = val.dtype
        if dtype == torch.bool:
            return torch.randint(0, 2, shape, generator=gen).bool()
        if dtype.is_floating_point or dtype.is_complex:
            return torch.randn(shape, generator=gen, dtype=torch.float32).to(dtype)
        return torch.randint(0, bound, shape, generator=gen).to(dtype)
    if isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return _hint(val)
    if isinstance(val, (list, tuple)):
        return type(val)(_make_value(v, bound, gen) for v in val)
    return val


def sample_args(
    program: Any, sample_inputs: Sequence[Any] | None = None
) -> tuple[list[Any], dict[str, Any]] | None:
    """``(args, kwargs)`` to call ``program`` with: ``sample_inputs`` when given, else an
    ExportedProgram's ``example_inputs``, else inputs made from the placeholders'
    ``meta['val']`` (of the GraphModule, or of the program's ``module()``). None when
    nothing is given and ``program`` is neither an ExportedProgram nor a GraphModule."""
    if sample_inputs is not None:
        return list(sample_inputs), {}
    if isinstance(program, torch.export.ExportedProgram):
        example = getattr(program, "example_inputs", None)
        if example is not None:
            args, kwargs = example
            return list(args), dict(kwargs)
        return sample_inputs_from_meta(program.module()), {}
    if isinstance(program, fx.GraphModule):
        return sample_inputs_from_meta(program), {}
    return None


def program_inputs(
    ep: torch.export.ExportedProgram, args: Sequence[Any], kwargs=None, *, strict: bool = True
) -> list:
    """The flat inputs of ``ep.graph_module``: parameters, buffers, constants, user inputs.

    Without ``strict``, a value that is not there (fewer user inputs than the program
    takes, a constant the program lacks) is None instead of an error.
    """
    from torch.export.graph_signature import InputKind

    user = iter(pytree.tree_leaves((tuple(args), dict(kwargs or {}))))
    state, consts = ep.state_dict, ep.constants
    out: list[Any] = []
    for spec in ep.graph_signature.input_specs:
        if spec.kind == InputKind.USER_INPUT:
            out.append(next(user) if strict else next(user, None))
        elif spec.kind == InputKind.TOKEN:
            out.append(torch.tensor([]))
        elif spec.target in state:
            out.append(state[spec.target])
        else:
            out.append(consts[spec.target] if strict else consts.get(spec.target))
    return out


def output_names(ep: torch.export.ExportedProgram) -> list[str]:
    """Names for the flat outputs of ``ep.graph_module`` (user outputs and mutated buffers)."""
    from torch.export.graph_signature import OutputKind

    names, user = [], 0
    for spec in ep.graph_signature.output_specs:
        if spec.kind == OutputKind.USER_OUTPUT:
            names.append(f"output {user}")
            user += 1
        else:
            names.append(f"{spec.kind.name.lower()} {spec.target}")
    return names
