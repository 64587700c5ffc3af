"""fxpass's stream ops: schemas, fake kernels, effects, and their place under export, DCE,
save/load and torch.compile."""

from __future__ import annotations

import io

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import fx

import fxpass as fp
from fxpass.ops.stream import STREAM_OPS, is_stream_op, stream_trace

OPS = torch.ops.fxpass


class _Scheduled(torch.nn.Module):
    """A hand-written two-stream schedule: ``b`` on stream 1, joined before the output."""

    def forward(self, x, w):
        OPS.record_event(0, 0)
        OPS.set_stream(1)
        OPS.wait_event(0, 1)
        b = torch.mm(x, w).relu()
        OPS.record_event(1, 1)
        OPS.set_stream(0)
        a = x.sin() * 2
        OPS.wait_event(1, 0)
        out = a + b
        OPS.record_stream(b, 0)
        return out


def _inputs():
    g = torch.Generator().manual_seed(0)
    return torch.randn(4, 8, generator=g), torch.randn(8, 8, generator=g)


def _sequence(gm: fx.GraphModule) -> list:
    """Stream ops with their constant arguments, and the compute ops, in graph order."""
    out = []
    for n in gm.graph.nodes:
        if is_stream_op(n):
            out.append((str(n.target), tuple(a for a in n.args if not isinstance(a, fx.Node))))
        elif n.op == "call_function":
            out.append(str(n.target))
    return out


def test_schemas_return_nothing_and_take_numbers():
    schemas = {str(op._schema) for op in STREAM_OPS}
    assert schemas == {
        "fxpass::set_stream(int stream) -> ()",
        "fxpass::record_event(int event, int stream) -> ()",
        "fxpass::wait_event(int event, int stream) -> ()",
        "fxpass::record_stream(Tensor t, int stream) -> ()",
    }


def test_on_cpu_they_do_nothing_but_run_in_order():
    x, w = _inputs()
    with stream_trace() as calls:
        out = _Scheduled()(x, w)
    assert torch.equal(out, x.sin() * 2 + torch.mm(x, w).relu())
    assert calls == [
        ("record_event", 0, 0),
        ("set_stream", 1),
        ("wait_event", 0, 1),
        ("record_event", 1, 1),
        ("set_stream", 0),
        ("wait_event", 1, 0),
        ("record_stream", 0),
    ]


@pytest.mark.parametrize(
    "call",
    [
        lambda: OPS.set_stream(-1),
        lambda: OPS.record_event(-2, 0),
        lambda: OPS.wait_event(0, -1),
        lambda: OPS.record_stream(torch.ones(2), -3),
    ],
)
def test_negative_numbers_are_refused_in_one_line(call):
    with pytest.raises(RuntimeError, match=r"must be a number >= 0 \(0 is the main stream\)"):
        call()


@pytest.mark.parametrize(
    "op, args",
    [
        (OPS.set_stream.default, (1,)),
        (OPS.record_event.default, (3, 1)),
        (OPS.wait_event.default, (3, 0)),
        (OPS.record_stream.default, (torch.randn(4, 6), 1)),
        (OPS.record_stream.default, (torch.randn(6, 4).t(), 1)),
        (OPS.record_stream.default, (torch.randn(4, 12)[:, ::2], 1)),
        (OPS.record_stream.default, (torch.randn(4, 1).expand(4, 6), 1)),
        (OPS.record_stream.default, (torch.randn(4, 6, requires_grad=True), 2)),
    ],
)
def test_opcheck(op, args):
    torch.library.opcheck(op, args)


_layouts = st.sampled_from(["contiguous", "transposed", "sliced", "expanded"])


@settings(max_examples=25, deadline=None)
@given(layout=_layouts, rows=st.integers(1, 5), cols=st.integers(1, 5), stream=st.integers(0, 3))
def test_record_stream_fake_agrees_with_real_on_every_layout(layout, rows, cols, stream):
    from torch._subclasses.fake_tensor import FakeTensorMode

    base = torch.randn(rows, cols * 2)
    t = {
        "contiguous": base,
        "transposed": base.t(),
        "sliced": base[:, ::2],
        "expanded": base[:, :1].expand(rows, cols),
    }[layout]
    before = (t.clone(), t.shape, t.stride(), t.storage_offset())
    assert OPS.record_stream(t, stream) is None
    assert torch.equal(t, before[0]) and (t.shape, t.stride(), t.storage_offset()) == before[1:]
    with FakeTensorMode() as mode:
        fake = mode.from_tensor(t)
        assert OPS.record_stream(fake, stream) is None
        assert (fake.shape, fake.stride(), fake.storage_offset()) == before[1:]


def _traced() -> fx.GraphModule:
    return torch.export.export(_Scheduled(), _inputs()).graph_module


def test_no_dead_code_elimination_removes_them():
    gm = _traced()
    want = _sequence(gm)
    gm.graph.eliminate_dead_code()
    assert _sequence(gm) == want
    result = fp.Pipeline.parse("fixpoint(cse,dce)").run(gm)
    assert _sequence(result.graph_module) == want
    assert all(n.is_impure() for n in gm.graph.nodes if is_stream_op(n))


def test_order_survives_export_decompositions_and_save_load():
    ep = torch.export.export(_Scheduled(), _inputs())
    want = _sequence(ep.graph_module)
    assert want[:3] == [
        ("fxpass.record_event.default", (0, 0)),
        ("fxpass.set_stream.default", (1,)),
        ("fxpass.wait_event.default", (0, 1)),
    ]
    decomposed = ep.run_decompositions()
    assert _sequence(decomposed.graph_module) == want
    buf = io.BytesIO()
    torch.export.save(decomposed, buf)
    buf.seek(0)
    loaded = torch.export.load(buf)
    assert _sequence(loaded.graph_module) == want
    again = torch.export.export(loaded.module(), _inputs())  # re-traced from its code
    assert _sequence(again.graph_module) == want
    x, w = _inputs()
    with stream_trace() as calls:
        got = loaded.module()(x, w)
    assert torch.equal(got, _Scheduled()(x, w)) and len(calls) == 7


def test_torch_compile_runs_them_between_compiled_graphs_in_order():
    torch._dynamo.reset()
    x, w = _inputs()
    model = _Scheduled()
    with stream_trace() as eager:
        want = model(x, w)
    explained = torch._dynamo.explain(model)(x, w)
    assert explained.graph_count == 3  # cut at the stream ops: they never enter a graph
    torch._dynamo.reset()
    with stream_trace() as compiled:
        got = torch.compile(model, backend="inductor")(x, w)
    assert compiled == eager
    torch.testing.assert_close(got, want)
    torch._dynamo.reset()
    with pytest.raises(Exception, match="fxpass"):
        torch.compile(model, fullgraph=True, backend="eager")(x, w)


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@cuda
def test_cuda_streams_and_events_follow_the_ops():
    from fxpass.ops.stream import reset_streams

    reset_streams()
    main = torch.cuda.current_stream()
    x, w = (t.cuda() for t in _inputs())
    OPS.set_stream(1)
    side = torch.cuda.current_stream()
    assert side != main
    OPS.set_stream(0)
    assert torch.cuda.current_stream() == main
    torch.testing.assert_close(_Scheduled()(x, w), x.sin() * 2 + torch.mm(x, w).relu())
    assert torch.cuda.current_stream() == main
    reset_streams()
