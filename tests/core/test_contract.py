"""The pass contract: every kind of pass runs, and "modified" is honest."""

from __future__ import annotations

import pytest
import torch
from torch import fx
from torch.fx.passes.infra.pass_base import PassBase as TorchPassBase
from torch.fx.passes.infra.pass_base import PassResult as TorchPassResult

import fxpass as fp

aten = torch.ops.aten


def _first(gm, target):
    return next(n for n in gm.graph.nodes if n.op == "call_function" and n.target is target)


def test_function_returning_none_that_changes_nothing_is_unmodified(llama_gm):
    def look(gm):
        for _ in gm.graph.nodes:
            pass

    result = fp.Pipeline([look]).run(llama_gm)
    assert result.modified is False
    assert result.report.find("look").modified is False


def test_function_returning_none_that_changes_the_graph_is_modified(llama_gm):
    def drop_asserts(gm):
        for n in list(gm.graph.nodes):
            if n.target is aten._assert_tensor_metadata.default:
                gm.graph.erase_node(n)

    before = len(llama_gm.graph.nodes)
    result = fp.Pipeline([drop_asserts]).run(llama_gm)
    assert result.modified is True
    assert result.report.find("drop_asserts").nodes_after < before


def test_claiming_false_after_changing_counts_as_modified_and_is_noted(llama_gm):
    def liar(gm) -> bool:
        node = _first(gm, aten.rsqrt.default)
        node.target = aten.sqrt.default
        return False

    result = fp.Pipeline([liar]).run(llama_gm)
    assert result.modified is True
    assert any("did not change" in n for n in result.report.find("liar").notes)
    assert "aten.sqrt.default" in llama_gm.code


def test_pass_result_and_stats_flow_into_the_report(llama_gm):
    def counter(gm):
        return fp.PassResult(gm, False, {"seen": len(gm.graph.nodes)})

    result = fp.Pipeline([counter]).run(llama_gm)
    assert result.report.find("counter").stats["seen"] == len(llama_gm.graph.nodes)
    assert result.stats["counter.seen"] == len(llama_gm.graph.nodes)
    gm, modified = result  # unpacks like torch's PassResult
    assert isinstance(result, TorchPassResult) and gm is llama_gm and modified is False


def test_lowering_pass_receives_sample_inputs(llama_gm):
    seen = {}

    def lower(gm: fx.GraphModule, sample_inputs) -> fx.GraphModule:
        seen["inputs"] = sample_inputs
        return gm

    inputs = [torch.ones(2)]
    result = fp.Pipeline([lower]).run(llama_gm, inputs)
    assert seen["inputs"] == inputs
    assert result.modified is False


def test_class_pass_runs_requires_call_ensures_in_order(llama_gm):
    calls = []

    class Traced(fp.Pass):
        def requires(self, gm):
            calls.append("requires")

        def call(self, gm):
            calls.append("call")
            return False

        def ensures(self, gm):
            calls.append("ensures")

    fp.Pipeline([Traced]).run(llama_gm)
    assert calls == ["requires", "call", "ensures"]
    assert Traced.name == "traced"


def test_failing_requires_names_the_pass_and_changes_nothing(llama_gm):
    class NeedsAdds(fp.Pass):
        def requires(self, gm):
            raise ValueError("no torch.add ops!")

        def call(self, gm):  # pragma: no cover - never reached
            return True

    code = llama_gm.code
    with pytest.raises(fp.PassFailedError, match="pass 'needs_adds' failed: ValueError"):
        fp.Pipeline([NeedsAdds()]).run(llama_gm)
    assert llama_gm.code == code


def test_torch_passbase_object_is_a_pass(llama_gm):
    class ReplaceRsqrt(TorchPassBase):
        def call(self, gm):
            _first(gm, aten.rsqrt.default).target = aten.sqrt.default
            return TorchPassResult(gm, True)

    result = fp.Pipeline([ReplaceRsqrt()]).run(llama_gm)
    assert result.modified
    assert result.report.passes[0].name == "replace_rsqrt"


def test_calling_a_pass_directly_runs_it_as_a_pipeline(llama_gm):
    class Noop(fp.Pass):
        def call(self, gm):
            return None

    result = Noop()(llama_gm)
    assert isinstance(result, fp.PassResult) and result.modified is False
    assert result.report is not None


def test_returning_a_new_graph_module_continues_with_it(llama_gm):
    def rebuild(gm):
        return fx.GraphModule(gm, gm.graph)

    def check_is_new(gm):
        assert gm is not llama_gm

    result = fp.Pipeline([rebuild, check_is_new]).run(llama_gm)
    assert result.graph_module is not llama_gm and result.modified


def test_a_pass_returning_something_else_is_a_clear_error(llama_gm):
    def bad(gm):
        return 42

    with pytest.raises(fp.PassFailedError, match="returned int; a pass returns a bool"):
        fp.Pipeline([bad]).run(llama_gm)


def test_as_pass_rejects_non_passes():
    with pytest.raises(TypeError, match="is not a pass"):
        fp.as_pass(3)
    with pytest.raises(TypeError, match="is a class but not a pass"):
        fp.as_pass(int)
