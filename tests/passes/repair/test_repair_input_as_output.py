"""repair_input_as_output: inputs returned as outputs get a clone (Torch-TensorRT's seed)."""

from __future__ import annotations

import pytest
import torch

import fxpass as fp
from fxpass.verify.testing import capture, check_pass


class _ReturnsInput(torch.nn.Module):
    def forward(self, x, y):
        return x, y.relu(), x


def _outputs_placeholders(gm) -> bool:
    return any(a.op == "placeholder" for a in gm.graph.output_node().all_input_nodes)


@pytest.mark.parametrize("how", ["aot", "trace"])
def test_inputs_returned_as_outputs_are_cloned(how):
    c = capture(_ReturnsInput(), (torch.randn(3), torch.randn(3)), how)
    assert _outputs_placeholders(c.graph_module)
    check = check_pass("repair_input_as_output", c, modified=True)
    gm = check.graph_module
    assert not _outputs_placeholders(gm)
    clones = [n for n in gm.graph.nodes if n.target is torch.ops.aten.clone.default]
    assert len(clones) == 1  # one clone serves both output positions
    assert check.report.root.children[0].stats == {"clones_inserted": 1}
    assert clones[0].meta["fxpass_provenance"]["pass"] == "repair_input_as_output"


def test_it_is_a_lowering_pass_that_reads_sample_inputs():
    gm = torch.fx.symbolic_trace(lambda x, n: (x, n))  # n is not a tensor
    result = fp.registry.create("repair_input_as_output")(gm, [torch.randn(2), 3])
    assert result.report.root.children[0].stats == {"clones_inserted": 1}
    assert gm(torch.ones(2), 3)[1] == 3


def test_unknown_placeholders_stay_unless_assumed_tensors():
    gm = torch.fx.symbolic_trace(lambda x: (x,))
    assert fp.Pipeline.parse("repair_input_as_output").run(gm).modified is False
    spec = "repair_input_as_output{assume_tensors=true}"
    assert fp.Pipeline.parse(spec).run(gm).modified is True


def test_exported_llama_has_nothing_to_repair(llama_gm):
    result = fp.Pipeline.parse("repair_input_as_output").run(llama_gm)
    assert result.modified is False
