"""Instrumentation hooks and the built-in printers."""

from __future__ import annotations

import io

import pytest
import torch

import fxpass as fp

aten = torch.ops.aten


def drop_asserts(gm):
    for n in list(gm.graph.nodes):
        if n.target is aten._assert_tensor_metadata.default:
            gm.graph.erase_node(n)


def look(gm):
    return None


def boom(gm):
    for n in gm.graph.nodes:
        if n.target is aten.rsqrt.default:
            n.target = aten.sqrt.default
    raise RuntimeError("boom")


class Recorder(fp.core.Instrumentation):
    def __init__(self):
        self.events = []

    def before_pipeline(self, pipeline, gm, ctx):
        self.events.append(("before_pipeline", pipeline.name))

    def after_pipeline(self, pipeline, gm, report, ctx):
        self.events.append(("after_pipeline", report.error is None))

    def before_pass(self, record, gm, ctx):
        self.events.append(("before", record.name))

    def after_pass(self, record, gm, ctx):
        self.events.append(("after", record.name, record.modified))

    def on_failure(self, record, gm, error, ctx):
        self.events.append(("failure", record.name, type(error).__name__))

    def on_change(self, event, ctx):
        self.events.append(("change", event.kind, event.rule, event.index))


def test_hooks_fire_in_order_for_nested_pipelines(llama_gm):
    rec = Recorder()
    fp.Pipeline([drop_asserts, fp.Pipeline([look], name="inner")]).run(llama_gm, instrument=[rec])
    assert rec.events == [
        ("before_pipeline", "pipeline"),
        ("before", "drop_asserts"),
        ("after", "drop_asserts", True),
        ("before", "inner"),
        ("before", "look"),
        ("after", "look", False),
        ("after", "inner", False),
        ("after_pipeline", True),
    ]


def test_failure_hook_sees_the_graph_as_the_pass_left_it(llama_gm):
    seen = {}

    class Peek(fp.core.Instrumentation):
        def on_failure(self, record, gm, error, ctx):
            seen["failing_code"] = fp.core.instrument.graph_text(gm)

        def after_pipeline(self, pipeline, gm, report, ctx):
            seen["restored_code"] = fp.core.instrument.graph_text(gm)
            seen["error"] = report.error

    with pytest.raises(fp.PassFailedError):
        fp.Pipeline([boom]).run(llama_gm, instrument=[Peek()])
    assert "aten.sqrt" in seen["failing_code"]
    assert "aten.sqrt" not in seen["restored_code"]
    assert seen["error"].startswith("pass 'boom' failed")


def test_change_events_reach_instrumentation(llama_gm):
    rec = Recorder()

    def rewrites(gm):
        ctx = fp.current_context()
        for n in list(gm.graph.nodes):
            if n.target is aten._assert_tensor_metadata.default and ctx.allow():
                gm.graph.erase_node(n)
                ctx.notify(fp.core.ChangeEvent("erase", "drop-assert", old=[n]))
                fp.stat("erased")

    result = fp.Pipeline([rewrites]).run(llama_gm, instrument=[rec])
    changes = [e for e in rec.events if e[0] == "change"]
    assert changes and changes[0] == ("change", "erase", "drop-assert", 1)
    assert result.report.find("rewrites").stats["erased"] == len(changes)


def test_debug_counter_limits_the_number_of_changes(llama_gm):
    def rewrites(gm):
        ctx = fp.current_context()
        for n in list(gm.graph.nodes):
            if n.target is aten._assert_tensor_metadata.default and ctx.allow():
                gm.graph.erase_node(n)

    total = sum(1 for n in llama_gm.graph.nodes if n.target is aten._assert_tensor_metadata.default)
    counter = fp.core.DebugCounter(count=2)
    fp.Pipeline([rewrites]).run(llama_gm, debug_counter=counter)
    left = sum(1 for n in llama_gm.graph.nodes if n.target is aten._assert_tensor_metadata.default)
    assert left == total - 2
    assert counter.seen == total


def test_print_ir_after_change_prints_only_changed_passes(llama_gm):
    out = io.StringIO()
    printer = fp.core.PrintIR(after_change=True, stream=out)
    fp.Pipeline([look, drop_asserts, look]).run(llama_gm, instrument=[printer])
    text = out.getvalue()
    assert text.count("// ----- IR after") == 1
    assert "IR after drop_asserts" in text
    assert "_assert_tensor_metadata" not in text
    assert "def forward" in text


def test_print_ir_before_after_and_failure_with_filter(llama_gm):
    out = io.StringIO()
    printer = fp.core.PrintIR(
        before=True, after=True, after_failure=True, passes={"boom"}, stream=out
    )
    with pytest.raises(fp.PassFailedError):
        fp.Pipeline([look, boom]).run(llama_gm, instrument=[printer])
    text = out.getvalue()
    assert "IR before boom" in text and "IR after failure of boom: boom" in text
    assert "look" not in text
    assert "aten.sqrt" in text.split("IR after failure")[1]
    with pytest.raises(ValueError, match="style must be"):
        fp.core.PrintIR(style="svg")


def test_print_ir_graph_style(llama_gm):
    out = io.StringIO()
    fp.Pipeline([drop_asserts]).run(
        llama_gm, instrument=[fp.core.PrintIR(after=True, style="graph", stream=out)]
    )
    assert "graph():" in out.getvalue()


def test_timing_and_statistics_printers(llama_gm):
    timing, stats = io.StringIO(), io.StringIO()

    def counts(gm):
        fp.stat("nodes", len(gm.graph.nodes))

    fp.Pipeline([drop_asserts, fp.fixpoint(counts)]).run(
        llama_gm, instrument=[fp.core.Timing(timing), fp.core.Statistics(stats)]
    )
    assert "Execution time report" in timing.getvalue()
    assert "drop_asserts" in timing.getvalue() and "fixpoint" in timing.getvalue()
    assert "(nodes)" in stats.getvalue() and "(iterations) 1" in stats.getvalue()


def test_instrumented_context_applies_to_every_run(llama_gm):
    rec = Recorder()
    with fp.core.instrumented(rec):
        fp.Pipeline([look]).run(llama_gm)
    fp.Pipeline([look]).run(llama_gm)
    assert [e for e in rec.events if e[0] == "before_pipeline"] == [("before_pipeline", "pipeline")]


def test_print_ir_after_change_skips_fixpoint_rounds_that_changed_nothing(llama_gm):
    out = io.StringIO()
    seen = []

    class Seen(fp.core.Instrumentation):
        def after_pass(self, record, gm, ctx):
            seen.append((record.name, ctx.changed, record.modified))

    fp.Pipeline([fp.fixpoint(drop_asserts)]).run(
        llama_gm, instrument=[fp.core.PrintIR(after_change=True, stream=out), Seen()]
    )
    # round 1 removes the asserts, round 2 changes nothing (but the record stays modified)
    assert seen[:2] == [("drop_asserts", True, True), ("drop_asserts", False, True)]
    assert out.getvalue().count("IR after drop_asserts") == 1
