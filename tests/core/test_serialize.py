"""The .fxgraph format: exact round trips, and loading that never runs code from the file."""

from __future__ import annotations

import json

import pytest
import torch
from torch import fx

from fxpass.core.serialize import GraphFileError, _jsonable, load_graph, save_graph

import _models


def _same_graph(a: fx.GraphModule, b: fx.GraphModule) -> None:
    assert str(a.graph) == str(b.graph)
    assert a.code == b.code
    for x, y in zip(a.graph.nodes, b.graph.nodes):
        if isinstance(x.meta.get("val"), torch.Tensor):
            v, w = x.meta["val"], y.meta["val"]
            assert (v.shape, v.dtype, v.stride(), v.device) == (
                w.shape,
                w.dtype,
                w.stride(),
                w.device,
            )
        assert x.meta.get("stack_trace") == y.meta.get("stack_trace")
        # module classes are kept by name: loading must not import user code
        expected = _jsonable(x.meta.get("nn_module_stack"))
        assert _jsonable(y.meta.get("nn_module_stack")) == expected


def test_exported_graph_round_trips_with_metadata_and_inputs(tmp_path):
    ep = _models.exported(layers=1)
    inputs = [*_models.lifted_inputs(ep), torch.randint(0, 128, (1, 8))]
    path = save_graph(ep.graph_module, tmp_path / "g.fxgraph", inputs)
    gm, loaded_inputs = load_graph(path)
    _same_graph(ep.graph_module, gm)
    torch.testing.assert_close(gm(*loaded_inputs), ep.graph_module(*inputs))
    assert not list(tmp_path.glob(".*"))  # no temporary file left behind


def test_aot_and_dynamo_graphs_round_trip(tmp_path):
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            return torch.nn.functional.relu(self.lin(x))[:, 1:] + x.sum()

    from torch._functorch.aot_autograd import aot_module_simplified

    captured = {}

    def backend(gm, example_inputs):
        captured["dynamo"] = gm

        def fw(g, _):
            captured["aot"] = g
            return g

        return aot_module_simplified(gm, example_inputs, fw_compiler=fw)

    torch._dynamo.reset()
    x = torch.randn(2, 4)
    torch.compile(M(), backend=backend)(x)
    for kind in ("dynamo", "aot"):
        path = save_graph(captured[kind], tmp_path / f"{kind}.fxgraph")
        gm, inputs = load_graph(path)
        assert inputs is None
        _same_graph(captured[kind], gm)


def test_get_attr_tensors_and_parameters_are_saved(tmp_path):
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("scale", torch.tensor([2.0]))
            self.weight = torch.nn.Parameter(torch.randn(3))

        def forward(self, x):
            return x * self.scale + self.weight

    gm = fx.symbolic_trace(M())
    loaded, _ = load_graph(save_graph(gm, tmp_path / "m.fxgraph"))
    x = torch.randn(3)
    torch.testing.assert_close(loaded(x), gm(x))
    assert isinstance(loaded.weight, torch.nn.Parameter)
    assert "scale" in dict(loaded.named_buffers())


def test_unsupported_graphs_are_refused_with_a_reason(tmp_path):
    gm = fx.symbolic_trace(torch.nn.Sequential(torch.nn.Linear(2, 2)))
    with pytest.raises(GraphFileError, match=r"calls module '0' \(Linear\)"):
        save_graph(gm, tmp_path / "x.fxgraph")

    def custom(x):
        return x + 1

    g = fx.Graph()
    x = g.placeholder("x")
    g.output(g.call_function(custom, (x,)))
    with pytest.raises(GraphFileError, match="only torch ops and functions"):
        save_graph(fx.GraphModule({}, g), tmp_path / "y.fxgraph")
    assert not list(tmp_path.iterdir())
    with pytest.raises(GraphFileError, match="expects a torch.fx.GraphModule"):
        save_graph(torch.nn.Linear(1, 1), tmp_path / "z.fxgraph")


def test_bad_files_are_clear_errors(tmp_path):
    with pytest.raises(GraphFileError, match="no such graph file"):
        load_graph(tmp_path / "missing.fxgraph")
    garbage = tmp_path / "garbage.fxgraph"
    garbage.write_bytes(b"not a graph at all")
    with pytest.raises(GraphFileError, match="is not an fxpass graph file, or it is damaged"):
        load_graph(garbage)
    other = tmp_path / "other.fxgraph"
    torch.save({"hello": 1}, other)
    with pytest.raises(GraphFileError, match="no 'fxpass-graph' header"):
        load_graph(other)


def test_loading_never_imports_or_calls_arbitrary_code(tmp_path):
    gm = _models.exported_gm(layers=1)
    path = save_graph(gm, tmp_path / "g.fxgraph")
    payload = torch.load(path, weights_only=True)
    graph = json.loads(payload["graph"])
    node = next(n for n in graph["nodes"] if n["op"] == "call_function")
    node["target"] = {"py": "os:system"}
    payload["graph"] = json.dumps(graph)
    evil = tmp_path / "evil.fxgraph"
    torch.save(payload, evil)
    with pytest.raises(GraphFileError, match="refusing to load 'os:system'"):
        load_graph(evil)

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    pickled = tmp_path / "pickle.fxgraph"
    torch.save({"format": "fxpass-graph", "evil": Evil()}, pickled)
    with pytest.raises(GraphFileError, match="not an fxpass graph file"):
        load_graph(pickled)
