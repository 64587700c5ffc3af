"""``repair_input_as_output``: no graph input is also a graph output (Torch-TensorRT)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import fx

from ...core.context import PassContext
from ...core.contract import PassResult
from ...core.pass_registry import register
from ...edit.dialect_writer import Spelling
from ...fxutil.values import fake_value, node_val

__all__ = ["repair_input_as_output"]

_NAME = "repair_input_as_output"


def _is_tensor(node: fx.Node, index: int, sample_inputs: Sequence[Any]) -> bool | None:
    """Is the placeholder a tensor? From its example value, the sample input, its type."""
    val = node_val(node)
    if val is not None:
        return isinstance(val, torch.Tensor)
    if index < len(sample_inputs):
        return isinstance(sample_inputs[index], torch.Tensor)
    if isinstance(node.type, type):
        return issubclass(node.type, torch.Tensor)
    return None


@register(
    "repair_input_as_output",
    origin="fxpass",
    statistics={"clones_inserted": "inputs returned through a new clone"},
    keeps=("val", "layouts", "stack_trace", "nn_module_stack", "provenance"),
)
def repair_input_as_output(
    gm: fx.GraphModule,
    sample_inputs: Sequence[Any],
    ctx: PassContext,
    *,
    assume_tensors: bool = False,
) -> PassResult:
    """Insert a clone where a graph input is also a graph output.

    TensorRT engines (and other backends) reject a graph whose input is returned as an
    output; Torch-TensorRT's example lowering pass inserts an identity. Whether a
    placeholder is a tensor comes from its example value, the sample input at its position
    or its annotated type; placeholders that none of these describe are left alone unless
    ``assume_tensors=True``. One clone per input serves all of its output positions.

    Before / after::

        %x = placeholder[target=x]               %x = placeholder[target=x]
        %y = aten.relu(%x)                ->     %clone = aten.clone(%x)
        return (%x, %y)                          %y = aten.relu(%x)
                                                 return (%clone, %y)
    """
    inputs = list(sample_inputs or [])
    changed = False
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    spell = Spelling(gm.graph)  # an Edge graph gets an Edge clone
    editor = ctx.editor
    for index, node in enumerate(placeholders):
        outputs = [u for u in node.users if u.op == "output"]
        if not outputs:
            continue
        tensor = _is_tensor(node, index, inputs)
        if not (tensor or (tensor is None and assume_tensors)) or not editor.allow():
            continue
        target, args, kwargs = spell(torch.ops.aten.clone.default, (node,))
        with editor.change("insert", _NAME, [node]):
            clone = editor.insert(
                target, args, kwargs, rule="input_as_output", origin=[node], after=placeholders[-1]
            )
            val = fake_value(target, args, kwargs)
            if val is not None:
                clone.meta["val"] = val
            for out in outputs:
                editor.replace_input(out, node, clone, rule=_NAME)
        ctx.stat("clones_inserted")
        changed = True
    return PassResult(gm, changed)
