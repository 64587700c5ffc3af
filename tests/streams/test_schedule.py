"""apply_plan: exactly the syncs the dependencies need, side work issued first, lifetimes kept."""

from __future__ import annotations

import pytest
import torch
from _streams import HF_MODELS, SPEC, original, scheduled
from torch import fx

import fxpass as fp
from fxpass.edit.alias import node_memory
from fxpass.ops.stream import is_stream_op
from fxpass.streams import apply_plan, plan_streams
from fxpass.streams.regions import module_path
from fxpass.verify import check_streams, require_metadata
from fxpass.verify.streams import is_kernel

OPS = torch.ops.fxpass
aten = torch.ops.aten


def _ops(gm, op) -> list[fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target is op]


def test_every_wait_is_needed_and_every_event_is_waited_for():
    gm, _ = scheduled("moe")
    waits = _ops(gm, OPS.wait_event.default)
    records = _ops(gm, OPS.record_event.default)
    assert len({r.args[0] for r in records}) == len(records)  # one record per event
    assert {w.args[0] for w in waits} == {r.args[0] for r in records}
    for wait in waits:  # drop each wait in turn: the schedule must become unsafe
        after, args = wait.next, wait.args
        gm.graph.erase_node(wait)
        assert check_streams(gm), f"{wait.name} {args} was redundant"
        with gm.graph.inserting_before(after):
            gm.graph.call_function(OPS.wait_event.default, args)
    assert check_streams(gm) == []


def _three_streams() -> fx.GraphModule:
    graph = fx.Graph()
    x = graph.placeholder("x")
    a = graph.call_function(aten.relu.default, (x,))
    b = graph.call_function(aten.exp.default, (a,))
    c = graph.call_function(aten.add.Tensor, (b, a))
    graph.output(c)
    b.meta["stream"], c.meta["stream"] = 1, 2
    return fx.GraphModule(torch.nn.Module(), graph)


def test_a_wait_implied_through_another_stream_is_not_added():
    gm = _three_streams()
    stats = apply_plan(gm, plan_streams(gm, streams=3))
    waits = [tuple(n.args) for n in _ops(gm, OPS.wait_event.default)]
    # stream 1 waits for `a`; stream 2 waits for `b` only: that record already covers `a`;
    # stream 0 waits for stream 2 only: stream 2 has waited for stream 1
    assert [w[1] for w in waits] == [1, 2, 0]
    assert stats.waits == stats.events == 3
    assert check_streams(gm) == []
    x = torch.randn(5)
    torch.testing.assert_close(gm(x), x.relu().exp() + x.relu())


def test_side_work_is_issued_first_and_every_node_knows_its_stream():
    gm, _ = scheduled("moe")
    gm.graph.lint()
    order = [n for n in gm.graph.nodes if n.op == "call_function" and not is_stream_op(n)]
    assert all(isinstance(n.meta.get("stream"), int) for n in order)
    shared = next(n for n in order if "layers.0.mlp.shared_expert" in module_path(n))
    router = next(n for n in order if module_path(n) == "layers.0.mlp.gate" and is_kernel(n))
    assert order.index(shared) < order.index(router)
    assert shared.meta["stream"] == 1 and router.meta["stream"] == 0


def test_lifetimes_extended_only_where_the_tensor_could_be_freed_early():
    gm, result = scheduled("moe")
    keeps = _ops(gm, OPS.record_stream.default)
    assert len(keeps) == result.report.root.children[0].stats["record_streams"] > 0
    for keep in keeps:  # each one is needed
        args, after = keep.args, keep.next
        gm.graph.erase_node(keep)
        assert {v.kind for v in check_streams(gm)} == {"freed_early"}
        with gm.graph.inserting_before(after):
            gm.graph.call_function(OPS.record_stream.default, args)


def test_an_empty_plan_changes_nothing():
    gm = _three_streams()
    for n in gm.graph.nodes:
        n.meta.pop("stream", None)
    before = [n.name for n in gm.graph.nodes]
    stats = apply_plan(gm, plan_streams(gm, streams=2))
    assert stats.events == 0 and [n.name for n in gm.graph.nodes] == before


class _Changes(fp.core.Instrumentation):
    def __init__(self) -> None:
        self.events = []

    def on_change(self, event, ctx) -> None:
        self.events.append((event.kind, event.rule, [n.name for n in event.old]))


def test_every_edit_goes_through_the_editor_with_provenance():
    gm, _ = original("moe")
    changes = _Changes()
    pipe = fp.Pipeline.parse(SPEC).add_checks(require_metadata("val"))
    assert pipe.run(gm, instrument=[changes]).modified  # the metadata check passes
    ops = [n for n in gm.graph.nodes if is_stream_op(n)]
    inserted = [e for e in changes.events if e[0] == "insert"]
    assert len(inserted) == len(ops)
    assert any(e[:2] == ("modify", "multi_stream.order") for e in changes.events)
    for node in ops:
        rule = node.meta["fxpass_provenance"]["rule"]
        assert rule == f"multi_stream.{node.target._schema.name.split('::')[1]}"
        assert node.meta["from_node"] and node.meta["from_node"][0].pass_name == "multi_stream"
        assert isinstance(node.meta["stream"], int)
    for rec in _ops(gm, OPS.record_event.default):  # a record names the kernel it follows
        if rec.prev.op == "call_function" and not is_stream_op(rec.prev):
            assert rec.meta["from_node"][0].name == rec.prev.name


def test_a_scheduled_graph_passes_the_metadata_check_and_keeps_what_multi_stream_declares():
    """Every node of the scheduled graph has its value; every stream op carries torch's
    from_node; multi_stream held to its declaration (values, source metadata, provenance,
    stream assignments) by ``keeps_metadata`` after it runs."""
    from fxpass.core.pass_registry import REGISTRY
    from fxpass.verify.invariants import check_metadata, keeps_metadata

    gm, _ = original("moe")
    before = set(check_metadata(gm))
    pipe = fp.Pipeline.parse(SPEC).add_checks(keeps_metadata())
    assert pipe.run(gm).modified
    assert {"val", "stream", "provenance"} <= REGISTRY.create("multi_stream").keeps
    assert set(check_metadata(gm)) <= before  # nothing new misses a value or from_node
    ops = [n for n in gm.graph.nodes if is_stream_op(n)]
    assert ops and all(n.meta["from_node"] and "fxpass_provenance" in n.meta for n in ops)


@pytest.mark.parametrize("name", HF_MODELS)
def test_a_copying_view_on_a_side_stream_is_recorded_after_it_runs(name):
    """The GQA repeat (reshape of an expand) copies: its event comes after it."""
    gm, _ = scheduled(name)
    assert check_streams(gm) == []
    copies = [
        n
        for n in gm.graph.nodes
        if node_memory(n).kind == "copy"
        and n.meta.get("stream")
        and any(u.meta.get("stream") == 0 and is_kernel(u) for u in n.users)
    ]
    assert len(copies) >= 2  # k and v of each layer... at least one per layer
    for copy in copies:
        after = copy.next
        while after.op == "call_function" and not is_kernel(after):
            if after.target is OPS.record_event.default and after.args[1] == copy.meta["stream"]:
                break
            after = after.next
        assert after.target is OPS.record_event.default, f"{copy.name} is not recorded"
