"""Structured traces: what a pipeline run writes to torch's structured log (tlparse renders
it: tests/targets/test_backend_trace.py)."""

from __future__ import annotations

import json

import pytest

import fxpass as fp
from fxpass.core.trace import StructuredTrace, run_label, tracing

from _models import exported_gm
from _traces import fxpass_artifacts


@pytest.fixture
def captured():
    with fxpass_artifacts() as handler:
        yield handler


def explode(gm):
    raise RuntimeError("kaboom")


def test_every_pass_writes_its_record_and_its_changes(captured):
    assert tracing()
    gm = exported_gm()
    fp.apply(gm, "remove_assert_ops,fixpoint(cse,dce),fuse_add_rmsnorm")
    names = [name for name, _ in captured.artifacts]
    assert names[0] == "fxpass_pipeline_graph_before"
    assert names[1:4] == [
        "fxpass_pipeline_01_remove_assert_ops",
        "fxpass_pipeline_01_remove_assert_ops_changes",
        "fxpass_pipeline_02_cse",
    ]
    assert names[-2:] == ["fxpass_pipeline_report", "fxpass_pipeline_graph_after"]
    payloads = dict(captured.artifacts)
    record = json.loads(payloads["fxpass_pipeline_01_remove_assert_ops"])
    assert record["changed"] and record["stats"]["removed"] > 0 and "ms" in record
    diff = payloads["fxpass_pipeline_01_remove_assert_ops_changes"]
    assert diff.startswith("--- before") and "-    _assert_tensor_metadata" in diff
    fused = [n for n in names if n.endswith("_fuse_add_rmsnorm_changes")]
    assert fused and "fused_add_rmsnorm" in payloads[fused[0]]
    report = json.loads(payloads["fxpass_pipeline_report"])
    assert report["modified"] and report["root"]["children"][0]["name"] == "remove_assert_ops"


def test_a_failure_and_its_rollback_are_in_the_trace(captured):
    gm = exported_gm()
    with pytest.raises(fp.PassFailedError):
        fp.Pipeline([explode], name="risky").run(gm, instrument=[StructuredTrace()])
    payloads = dict(captured.artifacts)
    failed = json.loads(payloads["fxpass_risky_explode_failed"])
    assert failed["error"] == "RuntimeError: kaboom"
    report = json.loads(payloads["fxpass_risky_report"])
    assert "restored" in report["rolled_back"] and "kaboom" in report["error"]
    assert "fxpass_risky_graph_after" not in payloads


def test_numerics_ride_along_when_checked(captured):
    gm = exported_gm(remove_asserts=True)
    check = fp.NumericsCheck()
    fp.apply(gm, "cse", instrument=[check])
    record = json.loads(dict(captured.artifacts)["fxpass_pipeline_01_cse"])
    assert record["numerics"]["comparison"]["ok"]


def test_run_labels_are_file_names():
    assert run_label("fusion", {"pipeline": "fusion", "hook": "post_grad_custom_post_pass"}) == (
        "fusion_post_grad_custom_post_pass"
    )
    assert run_label("dynamo", {"hook": "dynamo", "range": "tokens:1..8"}) == "dynamo_tokens_1_8"
    assert run_label("") == "pipeline"


def test_torchs_idle_trace_handler_does_not_turn_tracing_on():
    # Every process starts with torch's lazy trace handler (no directory) on the trace log;
    # it writes nothing, so runs must not render graphs for it.
    from torch._logging._internal import LazyTraceHandler, trace_log

    idle = LazyTraceHandler(None)
    saved = trace_log.handlers[:]
    trace_log.handlers[:] = [idle]
    try:
        assert not tracing()
        trace_log.addHandler(LazyTraceHandler("/tmp/fxpass-trace-never-written"))
        assert tracing()
    finally:
        trace_log.handlers[:] = saved
