"""The registered ``partition`` pass: a pipeline that ends in a partition step."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import fxpass as fp
from fxpass.partition import FUSED_META, fused_nodes

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "partition"))
from _partition_helpers import SUPPORT, exported_with_args

aten = torch.ops.aten


def assert_same(actual, expected) -> None:
    for a, e in zip(actual, expected, strict=True):
        assert torch.equal(a, e)


def test_pipeline_ends_in_a_partition_step():
    ep, args, expected = exported_with_args()
    gm = ep.graph_module
    pipe = fp.Pipeline.parse(f'partition{{support="{SUPPORT}"}}')
    assert str(pipe) == 'partition{support="elementwise | norm"}'
    result = pipe.run(gm)
    assert result.modified
    calls = fused_nodes(gm)
    assert calls and all(c.op == "call_module" for c in calls)
    record = result.report.root.children[0]
    assert record.stats["partitions"] == len(calls)
    assert record.stats["nodes"] == sum(len(c.meta[FUSED_META]["nodes"]) for c in calls)
    assert_same(gm(*args), expected)


def test_delegate_mode_keeps_the_exported_program_valid():
    ep, args, expected = exported_with_args()
    pipe = fp.Pipeline.parse('partition{support="elementwise | norm" mode=delegate prefix=npu_}')
    pipe.run(ep.graph_module)
    calls = fused_nodes(ep.graph_module)
    assert calls and all(c.args[0].target.startswith("npu_") for c in calls)
    ep.validate()
    assert_same(ep.graph_module(*args), expected)


def test_the_default_mode_works_on_an_exported_program_and_a_pt2_file(tmp_path):
    """On a program, ``auto`` calls the pieces with ``invoke_subgraph`` (its IR has no
    ``call_module``); the saved program loads back and computes the same."""
    ep, args, expected = exported_with_args()
    result = fp.apply(ep, f'partition{{support="{SUPPORT}"}}')
    calls = fused_nodes(result.graph_module)
    assert calls and all(c.op == "call_function" for c in calls)
    result.program.validate()
    assert_same(result.graph_module(*args), expected)
    torch.export.save(result.program, tmp_path / "p.pt2")
    assert_same(torch.export.load(tmp_path / "p.pt2").graph_module(*args), expected)


def test_options_reach_the_partitioner():
    ep, _, _ = exported_with_args()
    gm = ep.graph_module
    fp.Pipeline.parse(
        'partition{support="elementwise | norm" allows_single_node_partition=true}'
    ).run(gm)
    with_singles = len(fused_nodes(gm))
    ep, _, _ = exported_with_args()
    gm = ep.graph_module
    fp.Pipeline.parse('partition{support="elementwise | norm"}').run(gm)
    assert with_singles > len(fused_nodes(gm))


def test_a_debug_counter_stops_after_k_fusions():
    ep, args, expected = exported_with_args()
    gm = ep.graph_module
    pipe = fp.Pipeline.parse('partition{support="elementwise | norm"}')
    pipe.run(gm, debug_counter=fp.DebugCounter(count=2))
    assert len(fused_nodes(gm)) == 2
    assert_same(gm(*args), expected)


def test_nothing_supported_changes_nothing():
    ep, _, _ = exported_with_args()
    gm = ep.graph_module
    result = fp.Pipeline.parse("partition{support=none}").run(gm)
    assert not result.modified and fused_nodes(gm) == []


def test_bad_specs_fail_clearly_and_leave_the_graph_as_it_was():
    with pytest.raises(fp.OptionError, match="needs option 'support'"):
        fp.Pipeline.parse("partition")
    ep, _, _ = exported_with_args()
    gm = ep.graph_module
    before = gm.code
    with pytest.raises(fp.PassFailedError, match="did you mean elementwise"):
        fp.Pipeline.parse('partition{support="elementwse"}').run(gm)
    assert gm.code == before and fused_nodes(gm) == []


def test_listed_with_its_summary():
    info = fp.registry.REGISTRY.get("partition")
    assert info.summary.startswith("Fuse the largest cycle-free partitions")
    assert info.options["support"].required
    assert info.options["mode"].default == "auto"


def test_each_new_fusion_is_one_change_event_in_graph_order():
    ep, _, _ = exported_with_args()
    gm = ep.graph_module
    pipe = fp.Pipeline.parse('partition{support="elementwise | norm" prefix=first_}')
    pipe.run(gm, debug_counter=fp.DebugCounter(count=1))  # one call there before the run
    (old,) = fused_nodes(gm)

    class Record(fp.Instrumentation):
        def __init__(self):
            self.events = []

        def on_change(self, event, ctx):
            self.events.append(event)

    record = Record()
    fp.Pipeline.parse('partition{support="elementwise | norm"}').run(gm, instrument=[record])
    new = [c for c in fused_nodes(gm) if c is not old]
    assert len(new) >= 2
    assert [e.new for e in record.events] == [[c.name] for c in new]
    assert [e.old for e in record.events] == [c.meta[FUSED_META]["nodes"] for c in new]
    assert all(e.kind == "replace" and e.rule == "partition" for e in record.events)
