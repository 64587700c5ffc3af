"""erase_copy: readers of a copy read its source; unobservable copies go; others stay."""

from __future__ import annotations

import torch
from _cleanup_helpers import calls

import fxpass as fp
from fxpass.verify.compare import compare_outputs
from fxpass.verify.numerics import run_graph
from fxpass.verify.testing import capture, check_pass


class _Staging(torch.nn.Module):
    """SGLang's pattern: compute into a scratch buffer, then read the buffer."""

    def forward(self, x):
        buf = torch.empty_like(x)
        buf.copy_(x * 2)
        return (buf.relu() + buf,)


def test_copy_into_scratch_memory_goes_and_readers_read_the_source():
    check = check_pass(
        "erase_copy,dce", _Staging(), (torch.randn(4, 8),), capture_with="dynamo", modified=True
    )
    gm = check.graph_module
    assert calls(gm, "copy_") == 0 and calls(gm, "empty_like") == 0
    stats = check.report.root.children[0].stats
    assert stats == {"readers_forwarded": 2, "copies_erased": 1}


def test_functional_copy_in_an_aot_graph_goes():
    c = capture(_Staging(), (torch.randn(4, 8),), "aot")
    assert calls(c.graph_module, "copy") == 1
    check = check_pass("erase_copy,dce", c, modified=True)
    assert calls(check.graph_module, "copy") == 0


class _IntoInput(torch.nn.Module):
    def forward(self, x, out):
        out.copy_(x * 2)  # the caller sees out: the copy stays
        return (out.sum(),)


def test_copy_into_an_input_stays_but_its_readers_read_the_source():
    c = capture(_IntoInput(), (torch.randn(4), torch.zeros(4)), "dynamo")
    result = fp.Pipeline.parse("erase_copy").run(c.graph_module)
    assert calls(c.graph_module, "copy_") == 1
    assert result.report.root.children[0].stats == {"readers_forwarded": 1}
    sum_node = next(n for n in c.graph_module.graph.nodes if n.target == "sum")
    assert sum_node.args[0].target is not None and sum_node.args[0].target.__name__ == "mul"


class _SourceWrittenLater(torch.nn.Module):
    def forward(self, x):
        s = x * 2
        buf = torch.empty_like(x)
        buf.copy_(s)
        s.add_(1)  # buf keeps the old values: its readers must not read s
        return (buf + s,)


def test_copy_whose_source_is_written_later_stays():
    c = capture(_SourceWrittenLater(), (torch.randn(4),), "dynamo")
    expected = run_graph(c.graph_module, c.inputs)
    result = fp.Pipeline.parse("erase_copy").run(c.graph_module)
    assert result.modified is False and calls(c.graph_module, "copy_") == 1
    assert compare_outputs(expected, run_graph(c.graph_module, c.inputs)).ok


class _Broadcast(torch.nn.Module):
    def forward(self, x):
        buf = torch.zeros(4, 8)
        buf.copy_(x)  # x is (8,): the copy broadcasts, buf is not x
        return (buf * 2,)


def test_broadcasting_copy_stays():
    c = capture(_Broadcast(), (torch.randn(8),), "dynamo")
    result = fp.Pipeline.parse("erase_copy").run(c.graph_module)
    assert result.modified is False and calls(c.graph_module, "copy_") == 1
