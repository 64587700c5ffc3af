import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
import torch
from _target_models import aten, fold_param_permute, remove_unused_inputs, rsqrt_to_reciprocal_sqrt

import fxpass as fp
from fxpass.core.pass_registry import REGISTRY
from fxpass.interpret import InterpreterPass
from fxpass.models.llama import build_decoder
from fxpass.targets.inductor import InductorPass, inductor_pass, pipeline_uuid

HERE = Path(__file__).parent


def scale_by(gm, *, factor: float = 1.0) -> bool:
    """A pass with an option (does nothing: only its identity matters here)."""
    return False


class Nonce(fp.Pass):
    """Changes nothing; its option makes a pipeline's uuid new (a cold FX graph cache)."""

    def __init__(self, value: str = ""):
        self.value = value

    def call(self, gm):
        return False


class Scaled(InterpreterPass):
    def __init__(self, factor: float = 1.0):
        self.factor = factor


@pytest.fixture
def registered_scale():
    REGISTRY.register("_targets_test_scale_by", replace=True)(scale_by)
    yield "_targets_test_scale_by"
    REGISTRY.unregister("_targets_test_scale_by")


_SCRIPT = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {here!r})
    import fxpass as fp
    from _target_models import fold_param_permute, remove_unused_inputs
    from fxpass.targets.inductor import inductor_pass
    pipe = fp.Pipeline([fold_param_permute, fp.fixpoint(remove_unused_inputs)])
    print(inductor_pass(pipe).uuid())
    """
)


def _uuid_in_subprocess(seed: str) -> str:
    # PYTHONPATH kept: the child must import the fxpass under test, not another checkout
    env = {"PYTHONHASHSEED": seed, "PATH": "/usr/bin:/bin"}
    env.update({k: v for k, v in os.environ.items() if k == "PYTHONPATH"})
    out = subprocess.run(
        [sys.executable, "-c", _SCRIPT.format(here=str(HERE))],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return out.stdout.strip().splitlines()[-1]


def test_uuid_is_the_same_in_other_processes():
    pipe = fp.Pipeline([fold_param_permute, fp.fixpoint(remove_unused_inputs)])
    here = inductor_pass(pipe).uuid()
    assert len(here) == 64
    assert _uuid_in_subprocess("12345") == here  # another process, another hash seed


def test_uuid_changes_with_options_order_and_passes(registered_scale):
    def uuid_of(spec):
        return inductor_pass(fp.Pipeline.parse(spec)).uuid()

    a = uuid_of(f"{registered_scale}{{factor=2.0}}")
    assert a == uuid_of(f"{registered_scale}{{factor=2.0}}")
    assert a != uuid_of(f"{registered_scale}{{factor=3.0}}")
    assert a != uuid_of(f"fixpoint({registered_scale}{{factor=2.0}})")
    swapped = inductor_pass([rsqrt_to_reciprocal_sqrt, scale_by]).uuid()
    assert inductor_pass([scale_by, rsqrt_to_reciprocal_sqrt]).uuid() != swapped
    assert inductor_pass([Scaled(2.0)]).uuid() != inductor_pass([Scaled(3.0)]).uuid()
    assert inductor_pass([Scaled(2.0)]).uuid() == inductor_pass([Scaled(2.0)]).uuid()
    fix = fp.Pipeline([fp.fixpoint(scale_by, max_iterations=3)])
    assert pipeline_uuid(fix) != pipeline_uuid(fp.Pipeline([fp.fixpoint(scale_by)]))


def test_uuid_changes_when_the_pass_code_changes(tmp_path, monkeypatch):
    module = tmp_path / "fxpass_test_my_passes.py"
    monkeypatch.syspath_prepend(str(tmp_path))

    def uuid_of_current_code() -> str:
        sys.modules.pop("fxpass_test_my_passes", None)
        import fxpass_test_my_passes

        return inductor_pass([fxpass_test_my_passes.my_pass]).uuid()

    module.write_text("def my_pass(gm):\n    return False\n")
    first = uuid_of_current_code()
    assert uuid_of_current_code() == first
    module.write_text("def my_pass(gm):\n    return None\n")
    assert uuid_of_current_code() != first
    sys.modules.pop("fxpass_test_my_passes", None)


def test_chained_uuid_covers_the_pass_already_installed():
    class Existing(InductorPass):
        pass

    ours = inductor_pass([rsqrt_to_reciprocal_sqrt])
    chained = ours.chain(Existing([fold_param_permute]))
    assert chained.previous and chained.uuid() not in (None, ours.uuid())
    assert ours.chain(lambda graph: None).uuid() is None  # a plain callable cannot be cached
    assert ours.chain(None) is ours


def test_inductor_runs_the_pipeline_chained_and_caches():
    from torch._inductor import config

    class Existing(InductorPass):  # a pass some other library installed first
        def __call__(self, graph):
            calls.append(sum(1 for n in graph.nodes if n.target is aten.rsqrt.default))

    calls: list[int] = []
    # config.patch, not monkeypatch: undoing monkeypatch deletes an Inductor config entry
    with config.patch(post_grad_custom_post_pass=Existing([])):
        _chained_and_cached(calls, Existing)


def _chained_and_cached(calls, Existing):
    from torch._dynamo.utils import counters
    from torch._inductor import config

    torch._dynamo.reset()
    model = build_decoder(layers=1, hidden=32, intermediate=64, dtype=torch.float32)
    (ids,) = model.example_inputs()
    expected = model(ids)
    # a new uuid misses the FX graph cache of earlier runs but reuses compiled kernels
    ours = inductor_pass([rsqrt_to_reciprocal_sqrt, Nonce(uuid.uuid4().hex)])
    with torch.no_grad(), ours.installed() as chained:
        assert isinstance(config.post_grad_custom_post_pass, InductorPass)
        torch.testing.assert_close(torch.compile(model)(ids), expected)
        assert calls == [3], "the pass installed before ours ran first, on the original graph"
        assert len(chained.reports) == 1
        assert chained.reports[0].root.children[0].stats == {"rsqrt_rewritten": 3}
        hits = counters["inductor"]["fxgraph_cache_hit"]
        torch._dynamo.reset()
        torch.testing.assert_close(torch.compile(model)(ids), expected)
        cached = counters["inductor"]["fxgraph_cache_hit"] > hits or (
            counters["aot_autograd"]["autograd_cache_hit"] > 0
        )
        assert cached, "a stable uuid keeps Inductor's cache on"
        assert len(chained.reports) == 1, "a cache hit does not run the passes again"
    assert isinstance(config.post_grad_custom_post_pass, Existing)  # put back
    torch._dynamo.reset()


def test_install_chains_and_bad_hooks_are_refused():
    from torch._inductor import config

    with config.patch(post_grad_custom_pre_pass=None):
        first = inductor_pass([scale_by]).install("post_grad_custom_pre_pass")
        second = inductor_pass([rsqrt_to_reciprocal_sqrt]).install("post_grad_custom_pre_pass")
        assert config.post_grad_custom_pre_pass is second and second.previous == (first,)
    with pytest.raises(ValueError, match="unknown Inductor hook"):
        inductor_pass([scale_by]).install("joint_custom_pass")


def test_a_pass_that_returns_a_new_module_still_edits_inductors_graph():
    from _target_models import convnet, convnet_ep

    class ReluToClampMin(InterpreterPass):  # interpreter passes build a new module
        def call_operator(self, op, args, kwargs, meta):
            if op is aten.relu.default:
                return super().call_operator(aten.clamp_min.default, (args[0], 0.0), {}, meta)
            return super().call_operator(op, args, kwargs, meta)

    gm = convnet_ep().module()
    graph = gm.graph
    hook_pass = inductor_pass([ReluToClampMin()])
    hook_pass(graph)  # what Inductor does: call with the graph, keep using that graph
    assert gm.graph is graph
    targets = [n.target for n in graph.nodes]
    assert targets.count(aten.clamp_min.default) == 2 and aten.relu.default not in targets
    gm.recompile()
    (x,) = convnet().example_inputs()
    torch.testing.assert_close(gm(x), convnet()(x))
    assert hook_pass.reports[0].root.modified


def test_uuid_changes_when_a_fused_ops_kernel_changes(tmp_path):
    """Inductor compiles against fake kernels: a fixed layout rule must not meet a cached graph."""
    from fxpass.targets.inductor import _ops_code_id

    (tmp_path / "ops").mkdir()
    kernel = tmp_path / "ops" / "norm.py"
    kernel.write_text("def fake(x):\n    return x.new_empty(x.shape)\n")
    first = _ops_code_id(str(tmp_path), ("ops",))
    assert "norm.py@" in first and _ops_code_id(str(tmp_path), ("ops",)) == first
    kernel.write_text("def fake(x):\n    return x.new_empty(x.shape).t()\n")
    assert _ops_code_id(str(tmp_path), ("ops",)) != first
    assert "ops/norm.py@" in _ops_code_id() and "fxutil/layout.py@" in _ops_code_id()
