import subprocess
import sys
import textwrap

import pytest
import torch
from _target_models import aten, convnet, rsqrt_to_reciprocal_sqrt

import fxpass as fp
from fxpass.models.llama import build_decoder
from fxpass.targets.backend import FxpassBackend, backend, default_backend, fxpass_backend


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _llama(layers=1):
    model = build_decoder(layers=layers, hidden=32, intermediate=64, dtype=torch.float32)
    return model, model.example_inputs()[0]


def _no_autograd_cache():
    return torch._functorch.config.patch(enable_autograd_cache=False)


def _rewritten(be):
    return sum(r.root.children[0].stats.get("rsqrt_rewritten", 0) for r in be.reports)


def relu_to_clamp(gm: torch.fx.GraphModule) -> bool:
    """relu -> clamp_min(x, 0) at the torch level and in ATen."""
    changed = False
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target in (
            aten.relu.default,
            torch.relu,
            torch.nn.functional.relu,
        ):
            with gm.graph.inserting_before(node):
                new = gm.graph.call_function(aten.clamp_min.default, (node.args[0], 0.0))
            node.replace_all_uses_with(new)
            gm.graph.erase_node(node)
            fp.stat("relu_rewritten")
            changed = True
    return changed


@pytest.mark.parametrize("ir", ["aten", "dynamo"])
def test_eager_compiler_on_llama(ir):
    model, ids = _llama()
    be = backend([rsqrt_to_reciprocal_sqrt], ir=ir, compiler="eager")
    with torch.no_grad():
        out = torch.compile(model, backend=be)(ids)
    torch.testing.assert_close(out, model(ids))
    assert be.compiles == 1 and _rewritten(be) == 3  # 3 norms in one layer


def test_aten_ir_sees_aot_graphs_with_fake_sample_inputs():
    model, ids = _llama()
    seen = {}

    def look(gm, sample_inputs):
        seen["targets"] = {n.target for n in gm.graph.nodes if n.op == "call_function"}
        seen["inputs"] = sample_inputs
        return gm

    with torch.no_grad():
        torch.compile(model, backend=backend(look, ir="aten", compiler="eager"))(ids)
    assert aten.mm.default in seen["targets"]
    assert all(isinstance(x, torch._subclasses.FakeTensor) for x in seen["inputs"])


def test_core_aten_decompositions_can_be_asked_for():
    model, ids = _llama()
    seen = []
    be = backend(
        lambda gm: seen.append(gm.graph) or False, compiler="eager", decompositions="core_aten"
    )
    with torch.no_grad():
        torch.compile(model, backend=be)(ids)
    targets = {n.target for n in seen[0].nodes if n.op == "call_function"}
    assert aten.silu.default not in targets  # decomposed, as in export's core ATen


def test_inductor_after_the_passes_on_conv_net():
    model = convnet()
    (x,) = model.example_inputs()
    be = backend([relu_to_clamp])  # aten IR, Inductor: the passes run inside Inductor
    no_cache = {"fx_graph_cache": False}  # an earlier run's cached graph would skip the passes
    with torch.no_grad(), torch._inductor.config.patch(no_cache), _no_autograd_cache():
        out = torch.compile(model, backend=be)(x)
    torch.testing.assert_close(out, model(x))
    assert be.reports and be.reports[0].root.children[0].stats == {"relu_rewritten": 2}


def test_backward_graphs_run_the_pipeline_too():
    model = convnet()
    (x,) = model.example_inputs()
    seen = []

    def record(gm):
        seen.append(len(gm.graph.nodes))
        return False

    be = backend(record, compiler="eager")
    out = torch.compile(model, backend=be)(x)
    out.sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model(x).sum().backward()
    for got, want in zip(grads, [p.grad for p in model.parameters()]):
        torch.testing.assert_close(got, want)
    assert len(seen) == 2, "forward and backward graph"
    model.zero_grad()


def test_recompilations_match_a_stock_backend():
    from torch._dynamo.testing import CompileCounterWithBackend

    model = convnet()
    batches = [model.example_inputs(batch=b)[0] for b in (2, 3, 4, 5)]

    def run(compiler_fn):
        torch._dynamo.reset()
        compiled = torch.compile(model, backend=compiler_fn)
        with torch.no_grad():
            for x in batches:
                torch.testing.assert_close(compiled(x), model(x))

    stock = CompileCounterWithBackend("aot_eager")
    run(stock)
    ours = backend([relu_to_clamp], compiler="eager")
    run(ours)
    assert ours.compiles == stock.frame_count == 2  # static, then one dynamic graph


def test_dynamic_shapes_with_the_dynamo_ir():
    model = convnet()
    be = backend([relu_to_clamp], ir="dynamo", compiler="eager")
    compiled = torch.compile(model, backend=be, dynamic=True)
    with torch.no_grad():
        for b in (2, 3, 5):
            (x,) = model.example_inputs(batch=b)
            torch.testing.assert_close(compiled(x), model(x))
    assert be.compiles == 1
    assert be.reports[0].root.children[0].stats == {"relu_rewritten": 2}


def test_piecewise_dynamo_graph_split_at_attention():
    model, ids = _llama(layers=2)
    be = backend([rsqrt_to_reciprocal_sqrt], ir="dynamo", compiler="eager", split_at="attention")
    with torch.no_grad():
        out = torch.compile(model, backend=be)(ids)
    torch.testing.assert_close(out, model(ids))
    assert len(be.reports) == 3 and _rewritten(be) == 5


def test_piecewise_pieces_compiled_by_inductor():
    model, ids = _llama(layers=1)
    be = backend([rsqrt_to_reciprocal_sqrt], ir="dynamo", split_at="attention")
    with torch.no_grad():
        out = torch.compile(model, backend=be)(ids)
    torch.testing.assert_close(out, model(ids))
    assert _rewritten(be) == 3


def test_compile_options_configure_the_registered_backend():
    model, ids = _llama()
    before = len(default_backend().reports)
    options = {"ir": "dynamo", "compiler": "eager", "pipeline": [rsqrt_to_reciprocal_sqrt]}
    with torch.no_grad():
        out = torch.compile(model, backend=fxpass_backend, options=options)(ids)
    torch.testing.assert_close(out, model(ids))
    assert len(default_backend().reports) == before + 1


def test_a_failing_pass_fails_the_compile_with_its_name():
    model, ids = _llama()

    def broken(gm):
        raise RuntimeError("broken pass")

    compiled = torch.compile(model, backend=backend(broken, ir="dynamo", compiler="eager"))
    with pytest.raises(Exception, match="pass 'broken' failed"):
        compiled(ids)


def test_bad_configurations_are_refused():
    with pytest.raises(ValueError, match="ir must be one of"):
        backend(ir="torch")
    with pytest.raises(ValueError, match="compiler must be one of"):
        backend(compiler="tensorrt")
    with pytest.raises(ValueError, match="use it with ir='dynamo'"):
        backend(split_at="attention")
    assert isinstance(backend(), FxpassBackend)
    assert "ir='aten'" in repr(backend())


def test_backend_name_works_without_importing_fxpass():
    script = textwrap.dedent(
        """
        import sys, torch
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
        x = torch.randn(2, 4)
        assert "fxpass" not in sys.modules
        assert "fxpass" in torch._dynamo.list_backends()
        opts = {"ir": "dynamo", "compiler": "eager"}
        out = torch.compile(model, backend="fxpass", options=opts)(x)
        torch.testing.assert_close(out, model(x))
        from fxpass.targets.backend import default_backend
        print("compiles", default_backend().compiles)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().endswith("compiles 1")


def test_split_at_leaves_graphs_without_the_op_whole():
    model = convnet()  # no attention anywhere (as in a graph after a graph break)
    (x,) = model.example_inputs()
    be = backend([relu_to_clamp], ir="dynamo", compiler="eager", split_at="attention")
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(model, backend=be)(x), model(x))
    assert len(be.reports) == 1 and be.reports[0].root.children[0].stats == {"relu_rewritten": 2}


def test_a_given_pipeline_is_parsed_once_and_none_reads_the_default_each_time(monkeypatch):
    import fxpass.targets.backend as backend_module
    import fxpass.targets.runner as runner_module

    calls = []
    real = runner_module.resolve_pipeline

    def counting(pipeline=None):
        calls.append(pipeline)
        return real(pipeline)

    for module in (backend_module, runner_module):  # the door resolves, the runner reads None
        monkeypatch.setattr(module, "resolve_pipeline", counting)
    be = backend("remove_assert_ops", ir="dynamo", compiler="eager")
    assert be.pipeline is be.pipeline and calls == ["remove_assert_ops"]
    assert be._for_call("default", {"fullgraph": True}).pipeline is be.pipeline
    assert calls == ["remove_assert_ops"]
    default = backend(ir="dynamo", compiler="eager")
    assert default.pipeline is not default.pipeline  # made anew each time
    assert calls[1:] == [None, None]


def test_split_at_a_predicate_only_the_graph_inputs_satisfy_is_refused():
    model = convnet()
    (x,) = model.example_inputs()
    be = backend([], ir="dynamo", compiler="eager", split_at=lambda n: n.op == "placeholder")
    with pytest.raises(Exception, match="nothing to split at"):
        torch.compile(model, backend=be)(x)
