"""remove_noop: no-op views, conversions, copies and eval dropouts go; look-alikes stay."""

from __future__ import annotations

import pytest
import torch
from _cleanup_helpers import calls

import fxpass as fp
from fxpass.verify.compare import compare_outputs
from fxpass.verify.inputs import sample_inputs_from_meta
from fxpass.verify.numerics import run_graph
from fxpass.verify.testing import Captured, capture, check_pass

from _models import count, exported_gm

aten = torch.ops.aten


def test_same_shape_expands_go_contiguity_clones_stay_in_an_exported_llama():
    gm = exported_gm(layers=1, remove_asserts=True)
    assert count(gm, aten.expand.default) == 4 and count(gm, aten.clone.default) == 1
    c = Captured(gm, sample_inputs_from_meta(gm), "export")
    check = check_pass("remove_noop", c, modified=True)
    out = check.graph_module
    assert count(out, aten.expand.default) == 0
    # the clone makes a permuted tensor contiguous for the view after it: not a no-op
    assert count(out, aten.clone.default) == 1


class _EvalDropout(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.drop = torch.nn.Dropout(0.1)

    def forward(self, x):
        return (self.drop(self.lin(x)).relu(),)


@pytest.mark.parametrize("how", ["export", "aot", "dynamo", "trace"])
def test_eval_mode_dropout_goes(how):
    model = _EvalDropout().eval()
    check = check_pass("remove_noop", model, (torch.randn(2, 8),), capture_with=how, modified=True)
    gm = check.graph_module
    assert calls(gm, "clone") == calls(gm, "dropout") == 0
    assert not any(n.op == "call_module" and "drop" in n.target for n in gm.graph.nodes)


def test_train_mode_dropout_stays():
    model = _EvalDropout().train()
    c = capture(model, (torch.randn(2, 8),), "dynamo")
    result = fp.Pipeline.parse("remove_noop").run(c.graph_module)
    assert result.modified is False and calls(c.graph_module, "dropout") == 1


class _Copies(torch.nn.Module):
    def forward(self, x):
        y = x.clone()
        y.add_(1)  # the clone is written: x must not be
        t = x * 2
        z = t.clone()
        t.add_(1)  # the source is written while the clone is still read
        w = (x * 3).clone()  # a copy nobody can tell from its source
        return y + z, t, w.to(torch.float64), w.to(torch.float32)


def test_only_unobservable_copies_and_same_dtype_conversions_go():
    c = capture(_Copies(), (torch.randn(4),), "dynamo")
    before = run_graph(c.graph_module, [t.clone() for t in c.inputs])
    result = fp.Pipeline.parse("remove_noop").run(c.graph_module)
    gm = result.graph_module
    assert calls(gm, "clone") == 2  # y and z stay, w's goes
    assert calls(gm, "to") == 1  # to(float64) stays
    assert result.report.root.children[0].stats == {"copies_removed": 1, "views_removed": 1}
    assert compare_outputs(before, run_graph(gm, [t.clone() for t in c.inputs])).ok


class _Returns(torch.nn.Module):
    def forward(self, x):
        t = x * 2
        return x.clone(), x.view(4), t, t.clone()


@pytest.mark.parametrize("how", ["aot", "dynamo"])
def test_inputs_never_become_outputs_and_outputs_never_alias(how):
    c = capture(_Returns(), (torch.randn(4),), how)
    clones = calls(c.graph_module, "clone")
    fp.Pipeline.parse("remove_noop").run(c.graph_module)
    out = c.graph_module.graph.output_node()
    assert not any(a.op == "placeholder" for a in out.all_input_nodes)
    assert calls(c.graph_module, "clone") == clones
