"""cse: identical pure nodes merge; random draws, written memory and -0.0 do not."""

from __future__ import annotations

import pytest
import torch
from _cleanup_helpers import calls

import fxpass as fp
from fxpass.verify.compare import compare_outputs
from fxpass.verify.numerics import run_graph
from fxpass.verify.testing import capture, check_pass

from _models import count, exported_gm

aten = torch.ops.aten


def test_merges_the_repeated_views_of_an_exported_llama():
    gm = exported_gm(layers=2)
    views = count(gm, aten.view.default)
    check = check_pass("cse", gm_capture(gm), modified=True)
    merged = check.report.root.children[0].stats["merged"]
    # q, k and v each view the same normed activation to [8, 64]: two of three go per norm
    assert merged >= 4
    assert count(check.graph_module, aten.view.default) <= views - 4


def gm_capture(gm):
    from fxpass.verify.inputs import sample_inputs_from_meta
    from fxpass.verify.testing import Captured

    return Captured(gm, sample_inputs_from_meta(gm), "export")


class _Random(torch.nn.Module):
    def forward(self, x):
        return (torch.rand_like(x) + torch.rand_like(x), torch.nn.functional.dropout(x, 0.5))


@pytest.mark.parametrize("how", ["aot", "dynamo"])
def test_random_draws_are_never_merged(how):
    c = capture(_Random(), (torch.randn(8),), how)
    before = calls(c.graph_module, "rand_like") + calls(c.graph_module, "rand")
    fp.Pipeline.parse("cse").run(c.graph_module)
    assert calls(c.graph_module, "rand_like") + calls(c.graph_module, "rand") == before == 2


class _ReadsAcrossAWrite(torch.nn.Module):
    def forward(self, x):
        t = x * 1
        a = t.sum()
        t.add_(1)
        b = t.sum()  # same expression, different value
        c = x * 2
        d = x * 2  # merged
        return a, b, c + d


def test_reads_across_a_write_are_different_values():
    check = check_pass("cse", _ReadsAcrossAWrite(), (torch.randn(4),), capture_with="dynamo")
    gm = check.graph_module
    assert calls(gm, "sum") == 2
    assert check.report.root.children[0].stats == {"merged": 1}


class _WrittenLater(torch.nn.Module):
    def forward(self, x):
        a = x * 2
        b = x * 2
        a.add_(1)  # merging b into a would show this write through b
        return a, b


def test_values_whose_memory_is_written_are_not_merged():
    c = capture(_WrittenLater(), (torch.randn(4),), "dynamo")
    expected = run_graph(c.graph_module, c.inputs)
    result = fp.Pipeline.parse("cse").run(c.graph_module)
    assert result.modified is False
    assert compare_outputs(expected, run_graph(c.graph_module, c.inputs)).ok


class _SignedZero(torch.nn.Module):
    def forward(self, x):
        return torch.add(x, 0.0), torch.add(x, -0.0), torch.add(x, 0.0)


def test_signed_zeros_are_different_constants():
    check = check_pass("cse", _SignedZero(), (torch.tensor([-0.0, 1.0]),), capture_with="trace")
    assert calls(check.graph_module, "add") == 2
