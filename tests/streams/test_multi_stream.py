"""The multi_stream pass on the embedded decoders: where it splits, that the checker agrees,
and that outputs stay the same — eager, exported, saved and loaded, and under torch.compile."""

from __future__ import annotations

import io
import subprocess
import sys
import textwrap

import pytest
import torch
from _html_report import drawn_nodes
from _streams import HF_MODELS, MODELS, original, scheduled
from torch import fx

import fxpass as fp
from fxpass.models.llama import build_decoder
from fxpass.ops.stream import is_stream_op, stream_trace
from fxpass.streams.regions import module_path
from fxpass.verify import check_streams
from fxpass.verify.stream_assignment import stream_assignment
from fxpass.verify.streams import is_kernel

import _models

OPS = torch.ops.fxpass


def _stats(result) -> dict:
    return result.report.root.children[0].stats


def _streams_of(gm, where: str) -> set[int]:
    return {n.meta["stream"] for n in gm.graph.nodes if is_kernel(n) and where in module_path(n)}


@pytest.mark.parametrize("name", list(MODELS))
def test_second_stream_used_where_the_cost_model_says_and_outputs_are_equal(name):
    gm, result = scheduled(name)
    stats = _stats(result)
    assert result.modified and stats["regions_split"] >= 2 and stats["side_kernels"] > 0
    assert stats["waits"] == stats["events"] > 0
    assert check_streams(gm) == []
    before, inputs = original(name)
    with stream_trace() as calls:
        got = gm(*inputs)
    assert len(calls) == sum(1 for n in gm.graph.nodes if is_stream_op(n))
    for g, w in zip(got, before(*inputs)):
        assert torch.equal(g, w)


@pytest.mark.parametrize("name", HF_MODELS)
def test_gqa_moe_decoders_from_hugging_face_configs(name):
    gm, result = scheduled(name)
    stats = _stats(result)
    assert stats["regions_split"] >= 2 and stats["side_kernels"] > 0
    assert check_streams(gm) == []
    before, inputs = original(name)
    for g, w in zip(gm(*inputs), before(*inputs)):
        assert torch.equal(g, w)


def test_what_goes_where():
    moe, _ = scheduled("moe")
    assert _streams_of(moe, "mlp.shared_expert") == {1}
    assert _streams_of(moe, "mlp.experts") == {0}
    parallel, _ = scheduled("parallel")
    assert _streams_of(parallel, "layers.0.mlp") == {1}
    assert _streams_of(parallel, "layers.0.self_attn.o_proj") == {0}
    decoder, _ = scheduled("decoder")
    assert _streams_of(decoder, "self_attn.k_proj") == {1}
    assert _streams_of(decoder, "self_attn.q_proj") == {0}


def _schedule(gm: fx.GraphModule) -> list:
    """What runs where: each kernel's op and stream (from set_stream), and each stream op."""
    out, cur = [], 0
    for n in gm.graph.nodes:
        if is_stream_op(n):
            ints = tuple(a for a in n.args if isinstance(a, int))
            cur = ints[0] if n.target is OPS.set_stream.default else cur
            out.append((str(n.target), ints))
        elif is_kernel(n):
            out.append((str(n.target), cur))
    return out


def test_exported_program_schedule_survives_save_load_and_reexport():
    ep = _models.exported(**MODELS["moe"])
    (ids,) = ep.example_inputs[0]
    result = fp.apply(ep, "remove_assert_ops,multi_stream{streams=2}")
    program = result.program
    want = _schedule(program.graph_module)
    buf = io.BytesIO()
    torch.export.save(program, buf)
    buf.seek(0)
    loaded = torch.export.load(buf)
    assert _schedule(loaded.graph_module) == want
    assert check_streams(loaded.graph_module) == []
    assert torch.equal(loaded.module()(ids), ep.module()(ids))
    again = torch.export.export(loaded.module(), (ids,))
    assert _schedule(again.graph_module) == want  # re-traced: same kernels on same streams
    assert check_streams(again.graph_module) == []


def test_torch_compile_once():
    torch._dynamo.reset()
    model = build_decoder(layers=1, parallel_block=True, dtype=torch.float32)
    (ids,) = model.example_inputs()
    gm = torch.export.export(model, (ids,)).module()
    want = gm(ids)
    assert fp.apply(gm, "multi_stream").modified
    with stream_trace() as eager:
        assert torch.equal(gm(ids), want)
    with stream_trace() as compiled:
        got = torch.compile(gm, backend="eager")(ids)
    assert compiled == eager and len(eager) > 4  # every stream op, in order
    torch.testing.assert_close(got, want)


def test_options_from_the_spec_and_one_line_errors():
    pipe = fp.Pipeline.parse('multi_stream{streams=3 min_gain_us=0.5 side=["*.shared_expert"]}')
    assert str(pipe) == 'multi_stream{streams=3 min_gain_us=0.5 side=["*.shared_expert"]}'
    gm, _ = original("moe")
    before = gm.code
    with pytest.raises(fp.PassFailedError, match="streams must be a whole number >= 1") as err:
        fp.Pipeline.parse("multi_stream{streams=0}").run(gm)
    assert "ValueError" in str(err.value).splitlines()[0] and gm.code == before


def test_a_scheduled_graph_is_left_alone():
    gm, _ = scheduled("moe")
    result = fp.Pipeline.parse("multi_stream").run(gm)
    assert not result.modified and _stats(result) == {"already_scheduled": 1}


def test_a_later_pass_that_breaks_the_schedule_fails_and_rolls_back():
    def drop_first_wait(gm):
        gm.graph.erase_node(next(n for n in gm.graph.nodes if n.target is OPS.wait_event.default))

    gm, _ = original("moe")
    before = [n.name for n in gm.graph.nodes]
    with pytest.raises(fp.core.CheckFailedError) as err:
        fp.Pipeline(["multi_stream", "cse", drop_first_wait]).run(gm)
    assert err.value.pass_name == "drop_first_wait"
    assert err.value.check_name == "require_safe_streams" and "missing_sync" in str(err.value)
    assert [n.name for n in gm.graph.nodes] == before


def test_command_line(tmp_path):
    (tmp_path / "moe_model.py").write_text(
        textwrap.dedent(
            """
            from fxpass.models.llama import build_decoder

            def moe():
                model = build_decoder(layers=1, moe_experts=2)
                return model, model.example_inputs()
            """
        )
    )
    spec = "remove_assert_ops,multi_stream{streams=2}"
    proc = subprocess.run(
        [sys.executable, "-m", "fxpass", "run", "moe_model:moe", "-p", spec, "-o", "out.pt2",
         "--report", "r.html"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "multi_stream" in proc.stdout and "regions_split=" in proc.stdout
    loaded = torch.export.load(tmp_path / "out.pt2")
    assert any(is_stream_op(n) for n in loaded.graph.nodes)
    assert check_streams(loaded.graph_module) == []
    page = (tmp_path / "r.html").read_text()
    assert "id='streams'" in page and "every cross-stream dependency is covered" in page
    # the change list draws the events and waits multi_stream inserted, with what they serve
    new = [d for d in drawn_nodes(tmp_path / "r.html") if d["status"] == "new"]
    ops = {d["target"].split(".")[-2] for d in new if d["target"].startswith("fxpass.")}
    assert {"record_event", "wait_event"} <= ops
    for d in new:
        assert d["provenance"]["pass"] == "multi_stream" and d["from_node"], d


def test_it_preserves_the_stream_assignment_its_own_check_asked_for(monkeypatch):
    """Asked before the pass (everything on stream 0), the analysis is dropped by the first
    set_stream, computed once for the pass's two checks, and that value is served after the
    pass: to the schedule's invariant and to the next pass."""
    computed, seen = [], []
    compute = stream_assignment.compute
    monkeypatch.setattr(
        stream_assignment, "compute", lambda g: computed.append(compute(g)) or computed[-1]
    )

    def ask(gm):
        seen.append(stream_assignment(gm))
        return False

    gm, _ = original("moe")
    result = fp.Pipeline([ask, "multi_stream", ask], verify_analyses=True).run(gm)
    assert result.report.analysis_counts() == {
        "ask": {"stream_assignment": [1, 1]},
        "multi_stream": {"stream_assignment": [1, 1]},
    }
    assert seen[0].streams == [0] and seen[1].streams == [0, 1]
    assert seen[1] is computed[1]  # the pass's own (computed[2]: verification's, equal)
    assert computed[2] == seen[1] and computed[2] is not seen[1]
