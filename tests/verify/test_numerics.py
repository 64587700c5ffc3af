from __future__ import annotations

import copy
import math

import planted_passes
import pytest
import torch
from _verify_helpers import graph_and_inputs, program
from hypothesis import given, settings
from hypothesis import strategies as st

import fxpass as fp
from fxpass.verify import (
    NumericsCheck,
    NumericsError,
    compare_outputs,
    sample_inputs_from_meta,
    tolerance_for,
    verify_numerics,
)
from fxpass.verify.numerics import run_graph

import _models

aten = torch.ops.aten


def test_tolerances_depend_on_dtype():
    assert tolerance_for(torch.bfloat16)[0] > tolerance_for(torch.float16)[0]
    assert tolerance_for(torch.float16)[0] > tolerance_for(torch.float32)[0]
    assert tolerance_for(torch.float32)[0] > tolerance_for(torch.float64)[0]
    assert tolerance_for(torch.int64) == (0.0, 0.0)
    assert tolerance_for(torch.float32, rtol=0.5) == (0.5, tolerance_for(torch.float32)[1])


def test_where_the_largest_error_is():
    expected = torch.zeros(2, 3, 4)
    actual = expected.clone()
    actual[1, 2, 3] = 0.5
    actual[0, 0, 0] = 0.1
    cmp = compare_outputs([torch.ones(2), expected], [torch.ones(2), actual])
    assert not cmp.ok
    worst = cmp.worst
    assert (worst.output, worst.index, worst.actual) == (1, (1, 2, 3), 0.5)
    assert worst.mismatched == 2 and worst.numel == 24
    assert math.isclose(cmp.max_abs_error, 0.5)
    assert "output 1 at [1, 2, 3]" in str(cmp)
    with pytest.raises(NumericsError, match="numerics differ"):
        cmp.check()


def test_bf16_rounding_passes_but_real_errors_do_not():
    x = torch.randn(64, generator=torch.Generator().manual_seed(0))
    ref = x.to(torch.bfloat16)
    one_ulp = (x * (1 + 2**-8)).to(torch.bfloat16)
    assert compare_outputs(ref, one_ulp).ok
    assert not compare_outputs(ref, (x * 1.1).to(torch.bfloat16)).ok
    assert not compare_outputs(x, x * (1 + 1e-3)).ok  # float32 is held tighter


def test_nan_inf_shape_dtype_and_ints():
    nan = torch.tensor([float("nan"), float("inf"), 1.0])
    assert compare_outputs(nan, nan.clone()).ok
    assert not compare_outputs(nan, torch.tensor([1.0, float("inf"), 1.0])).ok
    assert not compare_outputs(nan, torch.tensor([float("nan"), -float("inf"), 1.0])).ok
    assert compare_outputs(torch.ones(2), torch.ones(3)).worst.reason == "shape"
    assert compare_outputs(torch.ones(2), torch.ones(2).double()).worst.reason == "dtype"
    assert not compare_outputs(torch.arange(4), torch.arange(4) + torch.tensor([0, 0, 0, 1])).ok
    assert compare_outputs((1, torch.ones(1)), (1, torch.ones(1))).ok
    assert compare_outputs([torch.ones(1)], []).worst.reason == "number of outputs"


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-1e3, 1e3), min_size=1, max_size=20), st.floats(0, 1e-6))
def test_float32_noise_below_tolerance_passes(values, noise):
    t = torch.tensor(values, dtype=torch.float32)
    assert compare_outputs(t, t + noise * t.abs()).ok


def test_inputs_from_meta_keep_embeddings_in_range():
    gm, _ = graph_and_inputs()
    inputs = sample_inputs_from_meta(gm)
    placeholders = gm.graph.find_nodes(op="placeholder")
    assert len(inputs) == len(placeholders)
    ids = inputs[-1]
    assert ids.dtype == torch.int64 and int(ids.min()) >= 0 and int(ids.max()) < 128
    assert all(a.shape == p.meta["val"].shape for a, p in zip(inputs, placeholders))
    assert torch.equal(ids, sample_inputs_from_meta(gm)[-1])  # seeded
    run_graph(gm, inputs)  # runs: every input has the shape and dtype the graph wants


def test_verify_numerics_of_programs():
    ep = program()
    assert verify_numerics(ep, program()).ok
    broken = program()
    planted_passes.add_as_sub_neg(broken.graph_module)
    broken.graph_module.recompile()
    cmp = verify_numerics(ep, broken)
    assert not cmp.ok and cmp.worst.output == 0
    assert verify_numerics(ep, broken, rtol=10.0, atol=10.0).ok is not False  # loose: passes


def test_numerics_check_names_the_first_diverging_pass():
    gm, inputs = graph_and_inputs()
    check = NumericsCheck()
    pipe = fp.Pipeline.parse("cse,planted_passes:add_as_sub_neg,dce")
    pipe.run(gm, inputs, instrument=[check])
    assert [r.name for r in check.results][:2] == ["cse", "add_as_sub_neg"]
    assert check.results[0].ok
    first = check.first_divergence
    assert first.name == "add_as_sub_neg"
    assert "pass 'planted_passes:add_as_sub_neg' diverges: output 0 at [" in str(first)


def test_numerics_check_skips_fixpoint_rounds_that_changed_nothing(monkeypatch):
    from fxpass.verify import numerics

    gm, inputs = graph_and_inputs()
    checked = []
    real = numerics.check_graph
    monkeypatch.setattr(numerics, "check_graph", lambda *a, **k: checked.append(1) or real(*a, **k))
    check = NumericsCheck(inputs)
    fp.Pipeline([fp.fixpoint("cse")]).run(gm, inputs, instrument=[check])
    # round 1 changes the graph, round 2 does not (its record stays modified)
    assert [r.name for r in check.results] == ["cse"] and len(checked) == 1
    assert check.ok


def test_numerics_check_reuses_outputs_the_caller_already_has(monkeypatch):
    from fxpass.verify import numerics

    gm, inputs = graph_and_inputs()
    reference = run_graph(gm, inputs)
    runs = []
    real = numerics.run_graph_promoted
    monkeypatch.setattr(numerics, "run_graph_promoted", lambda *a: runs.append(1) or real(*a))
    check = NumericsCheck(inputs, reference=reference, truth=None)
    fp.Pipeline.parse("cse,planted_passes:add_as_sub_neg").run(gm, inputs, instrument=[check])
    assert runs == [] and check.reference == reference
    assert [r.ok for r in check.results] == [True, False]
    # other inputs than the given ones: the check runs the original itself
    gm, inputs = graph_and_inputs()
    check = NumericsCheck(reference=reference, truth=None)
    fp.Pipeline(["cse"]).run(gm, inputs, instrument=[check])
    assert runs == [1] and check.ok


def test_numerics_check_can_stop_the_run():
    gm, inputs = graph_and_inputs()
    nodes = len(gm.graph.nodes)
    check = NumericsCheck(inputs, raise_on_divergence=True)
    with pytest.raises(NumericsError, match="after pass 'add_as_sub_neg'"):
        fp.Pipeline([planted_passes.add_as_sub_neg]).run(gm, inputs, instrument=[check])
    assert len(gm.graph.nodes) == nodes  # rolled back


def _unrunnable(gm: torch.fx.GraphModule) -> bool:
    """mm(a, b) -> add(a, b): shapes no longer broadcast, the graph cannot run."""
    node = next(n for n in gm.graph.nodes if n.target is aten.mm.default)
    node.target = aten.add.Tensor
    return True


def test_a_graph_that_no_longer_runs_is_a_divergence():
    gm, inputs = graph_and_inputs()
    check = NumericsCheck(inputs)
    fp.Pipeline([_unrunnable]).run(gm, inputs, instrument=[check])
    first = check.first_divergence
    assert first.comparison.worst.reason == "run"
    assert "the graph does not run: RuntimeError" in str(first)


def test_an_input_graph_that_does_not_run_cannot_be_verified():
    gm, inputs = graph_and_inputs()
    _unrunnable(gm)
    with pytest.raises(fp.FxpassError, match="cannot verify numerics: the input graph does not"):
        fp.Pipeline(["cse"]).run(gm, inputs, instrument=[NumericsCheck(inputs)])


def test_low_precision_rounding_is_told_from_wrong_results_by_a_float32_run():
    """Two bf16 results as far from the truth as each other pass even beyond tolerance; a
    result much further from it fails."""
    gen = torch.Generator().manual_seed(0)
    truth = torch.randn(4096, generator=gen) * 4
    expected = (truth + 0.05 * torch.randn(4096, generator=gen)).bfloat16()
    rounded = (truth + 0.05 * torch.randn(4096, generator=gen)).bfloat16()
    wrong = (truth * 1.1).bfloat16()

    assert not compare_outputs(expected, rounded)  # out of tolerance element by element ...
    ok = compare_outputs(expected, rounded, truth=truth)
    assert ok and len(ok.rounding) == 1 and ok.rounding[0].within_rounding  # ... but as accurate
    assert "no less accurate than the original" in ok.summary()
    assert not compare_outputs(expected, wrong, truth=truth)
    assert not compare_outputs(expected.float(), rounded.float(), truth=truth)  # fp32: no pass


def test_a_deep_bf16_model_fused_differently_is_accepted_and_a_bug_is_not():
    from fxpass.verify.compare import run_graph_promoted

    ep = _models.exported(layers=4)
    inputs = [*_models.lifted_inputs(ep), *_models.decoder(layers=4).example_inputs()]
    original = ep.graph_module
    truth = run_graph_promoted(original, inputs)
    assert truth is not None and truth[0].dtype == torch.float32
    reference = run_graph(original, inputs)
    fused = fp.Pipeline.parse("default").run(copy.deepcopy(original)).graph_module
    assert fp.verify_numerics(original, fused, inputs)  # with the float32 yardstick built in
    assert compare_outputs(reference, run_graph(fused, inputs), truth=truth)

    broken = copy.deepcopy(fused)
    for node in broken.graph.nodes:
        if node.target is torch.ops.fxpass.fused_add_rmsnorm.default:
            node.args = (*node.args[:3], 1.0)  # eps 1e-6 -> 1.0: a wrong rewrite
    assert not compare_outputs(reference, run_graph(broken, inputs), truth=truth)


def test_a_match_says_which_tolerance_applied_and_why():
    x = torch.tensor([0.0, 1.0, -2.0], dtype=torch.bfloat16)
    near = x + torch.tensor([0.0078, 0.0, 0.0], dtype=torch.bfloat16)  # rel error huge at 0
    text = compare_outputs([x], [near]).summary()
    assert text.startswith("1 output matches within bfloat16 tolerance (|error| <= 0.01 + ")
    assert "bfloat16 values round differently in fused kernels" in text
    assert text.endswith("(near zero, where atol applies)")
    given = compare_outputs([x.float()], [x.float()], rtol=0.5, atol=0.0).summary()
    assert "within the given tolerance (|error| <= 0 + 0.5·|expected|)" in given
    ints = compare_outputs([torch.arange(3)], [torch.arange(3)]).summary()
    assert ints.startswith("1 output matches exactly")
