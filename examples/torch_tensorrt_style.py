"""Torch-TensorRT style: lowering passes in an indexed list, dumped, applied, removed.

Torch-TensorRT registers ATen lowering passes ``(gm, sample_inputs) -> gm`` with
``@_aten_lowering_pass(index=...)``, lists them with ``dump_lowering_passes()``, runs them
with ``apply_lowering_passes(gm, sample_inputs)`` and removes one with
``_remove_lowering_pass(index=...)``. The same, with fxpass's registry:

    python examples/torch_tensorrt_style.py
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from _common import exported_decoder, show

import fxpass as fp

LIST = "aten_lowering"


@fp.register("repair_input_as_output_example", pass_list=LIST)
def repair_input_as_output(gm: torch.fx.GraphModule, sample_inputs: Sequence[torch.Tensor]):
    """Insert a clone where a graph input is also a graph output (TensorRT forbids it)."""
    for node in list(gm.graph.nodes):
        if node.op == "placeholder" and any(u.op == "output" for u in node.users):
            with gm.graph.inserting_after(node):
                clone = gm.graph.call_function(torch.ops.aten.clone.default, (node,))
            for user in [u for u in node.users if u.op == "output"]:
                user.replace_input_with(node, clone)
    gm.graph.lint()
    gm.recompile()  # as Torch-TensorRT passes do; fxpass defers it to one recompile per run
    return gm


@fp.register("remove_asserts_example", index=0, pass_list=LIST)
def remove_asserts(gm: torch.fx.GraphModule, sample_inputs: Sequence[torch.Tensor]):
    """Remove export's aten._assert_tensor_metadata nodes."""
    for node in list(gm.graph.nodes):
        if node.target is torch.ops.aten._assert_tensor_metadata.default:
            gm.graph.erase_node(node)
    return gm


@fp.register("report_inputs_example", index=1, pass_list=LIST)
def report_inputs(gm: torch.fx.GraphModule, sample_inputs: Sequence[torch.Tensor]):
    """Look at the sample inputs (lowering passes receive them); change nothing."""
    shapes = [tuple(t.shape) for t in sample_inputs]
    print(f"report_inputs_example saw sample inputs of shapes {shapes}")
    return gm


def main() -> None:
    ep, inputs = exported_decoder()
    gm = ep.graph_module
    lowering = fp.registry.pass_list(LIST)
    print(lowering.dump())
    show("before", gm, contains="assert")
    result = lowering.apply(gm, inputs)
    show("after", result.graph_module, contains="assert")
    print(result.report)
    removed = lowering.remove(1)  # like _remove_lowering_pass(index=1)
    print(f"removed {removed!r}; the list is now {lowering.names()}")


if __name__ == "__main__":
    main()
