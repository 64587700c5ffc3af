import pytest
import torch
from _target_models import aten, convnet, convnet_ep, fold_param_permute

import fxpass as fp
from fxpass.core.pass_registry import REGISTRY
from fxpass.targets.apply import ApplyResult, apply, resolve_pipeline

import _models


def drop_asserts(gm: torch.fx.GraphModule) -> bool:
    """Remove export's ``_assert_tensor_metadata`` checks."""
    asserts = [n for n in gm.graph.nodes if n.target is _models.ASSERT]
    for node in asserts:
        gm.graph.erase_node(node)
    return bool(asserts)


@pytest.fixture
def registered_drop_asserts():
    REGISTRY.register("_targets_test_drop_asserts", replace=True)(drop_asserts)
    yield "_targets_test_drop_asserts"
    REGISTRY.unregister("_targets_test_drop_asserts")


def test_graph_module_is_transformed_in_place(llama_ep):
    gm = llama_ep.module()  # parameters as attributes: callable with the model's inputs
    (ids,) = _models.decoder().example_inputs()
    expected = gm(ids)
    result = apply(gm, drop_asserts)
    assert isinstance(result, ApplyResult)
    assert result.program is gm and result.graph_module is gm and result.modified
    assert _models.count(gm, _models.ASSERT) == 0
    torch.testing.assert_close(gm(ids), expected)
    assert result.report.root.children[0].name == "drop_asserts"


def test_program_in_program_out_with_a_spec_string(llama_ep, registered_drop_asserts):
    (ids,) = _models.decoder().example_inputs()
    result = apply(llama_ep, f"{registered_drop_asserts},fixpoint({registered_drop_asserts})")
    assert isinstance(result.program, torch.export.ExportedProgram)
    assert result.graph_module is result.program.graph_module
    result.program.validate()
    assert _models.count(result.graph_module, _models.ASSERT) == 0
    assert _models.count(llama_ep.graph_module, _models.ASSERT) > 0  # original kept
    torch.testing.assert_close(result.program.module()(ids), llama_ep.module()(ids))


def test_failing_pass_restores_the_graph_module():
    gm = convnet_ep().module()
    before = str(gm.graph)
    code = gm.code

    def half_then_fail(g):
        for node in list(g.graph.nodes):
            if node.target is aten.relu.default:
                node.replace_all_uses_with(node.args[0])
                g.graph.erase_node(node)
        raise ValueError("half way")

    with pytest.raises(fp.PassFailedError, match="half way"):
        apply(gm, half_then_fail)
    assert str(gm.graph) == before and gm.code == code
    (x,) = convnet().example_inputs()
    torch.testing.assert_close(gm(x), convnet()(x))


def test_resolve_pipeline_forms():
    assert resolve_pipeline(None).name == "default"
    pipe = fp.Pipeline([drop_asserts])
    assert resolve_pipeline(pipe) is pipe
    assert [p.name for p in resolve_pipeline([drop_asserts, fold_param_permute])] == [
        "drop_asserts",
        "fold_param_permute",
    ]
    single = resolve_pipeline(drop_asserts)
    assert isinstance(single, fp.Pipeline) and single.name == "drop_asserts"
    assert str(resolve_pipeline("fixpoint(default)")) == "fixpoint(default)"


def test_default_pipeline_runs_when_none_is_given(llama_ep):
    result = apply(llama_ep)
    result.program.validate()
    assert result.report.root.name == "default"


def test_result_unpacks_like_a_pass_result():
    gm = torch.fx.symbolic_trace(convnet())
    program, modified = apply(gm, lambda g: False)
    assert program is gm and modified is False


def test_debug_counter_and_instruments_reach_the_run():
    ep = convnet_ep()
    seen = []

    class Watch(fp.core.Instrumentation):
        def after_pass(self, record, gm, ctx):
            seen.append((record.name, ctx.debug_counter))

    counter = fp.core.DebugCounter(count=0)
    apply(ep, fold_param_permute, instrument=[Watch()], debug_counter=counter)
    assert seen == [("fold_param_permute", counter)]


def test_wrong_targets_say_what_to_do():
    with pytest.raises(TypeError, match=r"torch.export.export\(model"):
        apply(convnet(), drop_asserts)
    with pytest.raises(TypeError, match="got str"):
        apply("model.pt2", drop_asserts)


# ----- strict warnings, portable programs, bad pipelines ----------------------------------------
def test_the_apply_path_is_clean_under_strict_warnings(tmp_path):
    """What many test suites set (-W error::FutureWarning -W error::DeprecationWarning): on a
    Hugging Face program, fxpass's apply, save and load warn nothing (torch's LeafSpec
    deprecation once came from fxpass copying pytree specs)."""
    import warnings

    from fxpass.targets.export import load

    _hf = pytest.importorskip("_hf")
    ep = _hf.exported("qwen3")
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        warnings.simplefilter("error", DeprecationWarning)
        result = apply(ep)
        assert result.modified
        torch.export.save(result.program, tmp_path / "out.pt2")
        load(tmp_path / "out.pt2", imports=["transformers"])


def test_portable_leaves_no_fxpass_op_and_computes_the_same():
    ep = _models.exported()
    fused = apply(ep)
    portable = apply(ep, portable=True)
    ops = {str(n.target) for n in portable.graph_module.graph.nodes}
    assert not any(op.startswith("fxpass.") for op in ops)
    assert portable.report.find("lower_fused_ops").stats["lowered"] == 5
    args = ep.example_inputs[0]
    torch.testing.assert_close(portable.program.module()(*args), fused.program.module()(*args))


@pytest.mark.parametrize("spec", ["", "  "])
def test_an_empty_spec_is_an_error(spec):
    with pytest.raises(fp.core.SpecError, match="the pipeline spec is empty"):
        apply(_models.exported_gm(), spec)
