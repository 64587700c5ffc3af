"""fxpass.compat.fx's pass manager against torch.fx.passes.infra's, on the same passes."""

from __future__ import annotations

import pytest
import torch
import torch.fx.passes.infra.pass_manager as torch_pm
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import fx
from torch.fx.passes.infra.pass_base import PassResult as TorchPassResult

from fxpass.compat import fx as compat

aten = torch.ops.aten


def _asserts(gm):
    return [n for n in gm.graph.nodes if n.target is aten._assert_tensor_metadata.default]


def drop_one_assert(gm):
    """Removes one assert per call: needs several rounds to finish."""
    found = _asserts(gm)
    if found:
        gm.graph.erase_node(found[0])


def noop(gm):
    return None


def _passes(n):
    def make(i):
        def p(gm):
            return None

        p.__name__ = f"p{i}"
        return p

    return [make(i) for i in range(n)]


@settings(max_examples=80, deadline=None)
@given(
    st.integers(2, 6).flatmap(
        lambda n: st.tuples(
            st.just(n),
            st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=8),
        )
    )
)
def test_topological_sort_matches_torch(case):
    n, pairs = case
    passes = _passes(n)
    constraints = [
        compat.this_before_that_pass_constraint(passes[a], passes[b]) for a, b in pairs if a != b
    ]
    try:
        expected = torch_pm._topological_sort_passes(list(passes), constraints)
    except RuntimeError as e:
        with pytest.raises(RuntimeError) as ours:
            compat._topological_sort_passes(list(passes), constraints)
        assert str(ours.value) == str(e)
        return
    assert compat._topological_sort_passes(list(passes), constraints) == expected


def test_validate_constraints_message_matches_torch():
    a, b = _passes(2)
    constraint = torch_pm.this_before_that_pass_constraint(b, a)
    theirs, ours = (
        torch_pm.PassManager([a, b], [constraint]),
        compat.PassManager([a, b], [constraint]),
    )
    with pytest.raises(RuntimeError) as t:
        theirs.validate_constraints()
    with pytest.raises(RuntimeError) as o:
        ours.validate_constraints()
    assert str(o.value) == str(t.value)


def test_honest_wrapper_stops_steps_as_soon_as_nothing_changes(llama_gm):
    rounds = {"torch": 0, "ours": 0}

    def counting(key):
        def p(gm):
            rounds[key] += 1

        return p

    torch_pm.PassManager([torch_pm.pass_result_wrapper(counting("torch"))], steps=5)(llama_gm)
    result = compat.PassManager([compat.pass_result_wrapper(counting("ours"))], steps=5)(llama_gm)
    assert rounds == {"torch": 5, "ours": 1}
    assert result.modified is False


def test_steps_run_until_the_graph_stops_changing(llama_gm):
    n = len(_asserts(llama_gm))
    pm = compat.PassManager([compat.pass_result_wrapper(drop_one_assert)], steps=n + 5)
    result = pm(llama_gm)
    assert result.modified and not _asserts(llama_gm)
    assert pm.report.root.stats["iterations"] == n + 1


def test_failure_message_matches_torch_and_our_module_is_restored(llama_gm):
    def boom(gm):
        drop_one_assert(gm)
        raise ValueError("bad")

    torch_gm = fx.GraphModule(llama_gm, llama_gm.graph)
    torch_gm = fx.GraphModule(torch_gm, torch.fx.Graph())
    torch_gm.graph.graph_copy(llama_gm.graph, {})
    passes = [torch_pm.pass_result_wrapper(noop), torch_pm.pass_result_wrapper(boom)]
    with pytest.raises(Exception) as theirs:
        torch_pm.PassManager(passes)(torch_gm)
    code = llama_gm.code
    ours_passes = [compat.pass_result_wrapper(noop), compat.pass_result_wrapper(boom)]
    with pytest.raises(Exception) as ours:
        compat.PassManager(ours_passes)(llama_gm)
    assert str(ours.value) == str(theirs.value)
    assert str(ours.value) == (
        "An error occurred when running the 'boom' pass after the following passes: ['noop']"
    )
    assert isinstance(ours.value.__cause__, ValueError)
    assert llama_gm.code == code and len(_asserts(llama_gm)) == len(_asserts(torch_gm)) + 1


def test_unwrapped_pass_gets_torchs_type_error(llama_gm):
    def unwrapped(gm):
        return None

    with pytest.raises(Exception, match="running the 'unwrapped' pass") as err:
        compat.PassManager([unwrapped])(llama_gm)
    assert str(err.value.__cause__) == (
        "The result of the pass unwrapped should be type PassResult."
        "Please wrap it with pass_result_wrapper()"
    )


def test_checks_run_and_suppression_works(llama_gm):
    seen = []

    def check(module):
        seen.append(len(_asserts(module)))
        if len(seen) > 1:
            raise AssertionError("invariant broken")

    pm = compat.PassManager(
        [compat.pass_result_wrapper(drop_one_assert)],
        run_checks_after_each_pass=True,
        suppress_check_failures=True,
    )
    pm.add_checks(check)
    with pytest.warns(UserWarning, match="suppressed check 'check' failed after pass"):
        result = pm(llama_gm)
    assert result.modified and len(seen) == 2
    assert "invariant broken" in pm.suppressed[0]

    strict = compat.PassManager(
        [compat.pass_result_wrapper(drop_one_assert)], run_checks_after_each_pass=True
    )
    seen.clear()
    strict.add_checks(check)
    with pytest.raises(Exception, match="running the 'drop_one_assert' pass"):
        strict(llama_gm)


def test_add_checks_signature_error_matches_torch():
    with pytest.raises(TypeError, match="should only take in one variable, a module"):
        compat.PassManager().add_checks(lambda a, b: None)


def test_code_generated_once_per_call_when_first_needed(llama_gm, monkeypatch):
    calls = []
    real = fx.GraphModule.recompile
    monkeypatch.setattr(fx.GraphModule, "recompile", lambda self: calls.append(1) or real(self))
    n = len(_asserts(llama_gm))
    compat.PassManager([compat.pass_result_wrapper(drop_one_assert)], steps=n + 1)(llama_gm)
    assert calls == []  # the module's code is lazy: generated when it is used
    assert "_assert_tensor_metadata" not in llama_gm.code
    assert len(calls) == 1


def test_pass_base_subclasses_work_in_both_managers(llama_gm):
    class DropAll(compat.PassBase):
        def call(self, gm):
            for n in _asserts(gm):
                gm.graph.erase_node(n)
            return compat.PassResult(gm, True)

    result = compat.PassManager([DropAll()])(llama_gm)
    assert isinstance(result, TorchPassResult) and result.modified and not _asserts(llama_gm)
    out = DropAll()(llama_gm)  # called directly: requires -> call -> ensures, like torch
    assert isinstance(out, compat.PassResult)
    with pytest.raises(TypeError):
        compat.PassBase()  # abstract, like torch's
