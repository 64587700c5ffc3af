"""The one fake-value evaluator: what each strictness does when it cannot compute a value,
the cache by input metadata, and the comparison of values."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from fxpass.fxutil.values import (
    FakeEvaluator,
    FakeResults,
    Strictness,
    fake_value,
    node_val,
    same_value,
)

import _models

aten = torch.ops.aten


@pytest.fixture(scope="module")
def gm():
    return _models.exported_gm()


def _mm(gm):
    return next(n for n in gm.graph.nodes if n.target is aten.mm.default)


def test_rerun_gives_what_the_node_records(gm):
    evaluator = FakeEvaluator.for_graph(gm)
    for node in [_mm(gm), next(n for n in gm.graph.nodes if n.target is aten.mul.Tensor)]:
        assert same_value(evaluator.rerun(node), node_val(node), grad=False)


def test_each_strictness_says_what_it_does_with_a_missing_input(gm):
    mm = _mm(gm)
    no_value = lambda n: None if n is mm.args[0] else node_val(n)  # noqa: E731
    with pytest.raises(ValueError, match=r"no example value \(meta\['val'\]\) for the input"):
        FakeEvaluator(strictness="raise").rerun(mm, value=no_value)
    for strictness in (Strictness.DECLINE, Strictness.LENIENT):
        evaluator = FakeEvaluator(strictness=strictness)
        assert evaluator.rerun(mm, value=no_value) is None
        assert f"for %{mm.name}" in evaluator.failures[-1]


def test_a_kernel_that_rejects_its_inputs_raises_unless_lenient(gm):
    mm = _mm(gm)
    a, b = node_val(mm.args[0]), node_val(mm.args[1])
    wrong = (a, b.t()[:3])  # inner sizes disagree
    for strictness in (Strictness.RAISE, Strictness.DECLINE):
        with pytest.raises(RuntimeError) as err:
            FakeEvaluator(strictness=strictness).run(aten.mm.default, wrong, node=mm)
        assert any(f"for %{mm.name}" in note for note in err.value.__notes__)
    lenient = FakeEvaluator(strictness="lenient")
    assert lenient.run(aten.mm.default, wrong) is None
    assert "aten.mm.default" in lenient.failures[-1]


def test_what_the_fake_mode_cannot_say_declines():
    x = torch.randn(4)
    with FakeTensorMode() as mode:
        fake = mode.from_tensor(x)
    evaluator = FakeEvaluator(mode, strictness="decline")
    assert evaluator.run(aten.nonzero.default, (fake,)) is None  # data-dependent size
    assert "nonzero" in evaluator.failures[-1]
    assert FakeEvaluator(strictness="decline", new_mode=False).run(aten.neg.default, (1.0,)) is None


def test_results_are_cached_by_input_metadata(gm):
    cache = FakeResults()
    evaluator = FakeEvaluator.for_graph(gm, cache=cache)
    mms = [n for n in gm.graph.nodes if n.target is aten.mm.default]
    first = [evaluator.rerun(n) for n in mms]
    inputs = {tuple((node_val(a).shape, node_val(a).stride()) for a in n.args) for n in mms}
    assert cache.hits == len(mms) - len(inputs) > 0
    assert all(same_value(v, node_val(n), grad=False) for v, n in zip(first, mms))


def test_a_layout_only_hit_is_the_remembered_layout_without_a_fake_tensor(gm):
    cache = FakeResults()
    evaluator = FakeEvaluator.for_graph(gm, cache=cache)
    mm = _mm(gm)
    args = tuple(node_val(a) for a in mm.args)
    first = evaluator.run(aten.mm.default, args, layout_only=True)  # a miss: computed, fake
    assert first.fake_mode is evaluator.mode
    again = evaluator.run(aten.mm.default, args, layout_only=True)
    assert again.device.type == "meta" and cache.hits == 1
    assert (again.shape, again.stride(), again.dtype) == (first.shape, first.stride(), first.dtype)
    assert evaluator.run(aten.mm.default, args, layout_only=True) is again  # built once
    fresh = evaluator.run(aten.mm.default, args)  # a caller that needs a value gets one
    assert fresh.fake_mode is evaluator.mode and fresh is not first
    transposed = (args[0], args[1].t())  # other input layouts: another entry
    other = evaluator.run(aten.mm.default, transposed, layout_only=True)
    assert other.fake_mode is evaluator.mode and cache.hits == 3  # two layout hits, one fresh


def test_a_hit_returns_what_is_preferred_where_its_metadata_fits(gm):
    cache = FakeResults()
    evaluator = FakeEvaluator.for_graph(gm, cache=cache)
    mm = _mm(gm)
    args = tuple(node_val(a) for a in mm.args)
    recorded = node_val(mm)
    first = evaluator.run(aten.mm.default, args, prefer=recorded)  # a miss: the kernel's own
    assert first is not recorded and same_value(first, recorded, grad=False)
    assert evaluator.run(aten.mm.default, args, prefer=recorded) is recorded  # a hit that fits
    other_layout = recorded.t().contiguous().t()  # same sizes, strides transposed
    assert not same_value(other_layout, recorded)
    fresh = evaluator.run(aten.mm.default, args, prefer=other_layout)
    assert fresh is not other_layout and same_value(fresh, recorded, grad=False)
    with FakeTensorMode() as elsewhere:  # another mode's tensor never stands in
        foreign = elsewhere.from_tensor(torch.empty(recorded.shape))
    assert evaluator.run(aten.mm.default, args, prefer=foreign) is not foreign
    assert cache.hits == 3


def test_a_tuple_result_takes_each_preferred_element_that_fits(gm):
    evaluator = FakeEvaluator.for_graph(gm, cache=FakeResults())
    x = node_val(_mm(gm))
    op = aten.var_mean.correction
    kwargs = {"dim": [-1], "keepdim": True}
    var, mean = evaluator.run(op, (x,), kwargs)  # a miss
    again = evaluator.run(op, (x,), kwargs, prefer=(None, mean))  # the first element fresh
    assert again[1] is mean and again[0] is not var and same_value(again[0], var)
    short = evaluator.run(op, (x,), kwargs, prefer=(var,))  # fewer elements than results
    assert short[0] is var and short[1] is not mean


def test_a_result_that_requires_grad_is_computed_each_time_never_a_built_leaf():
    cache = FakeResults()
    with FakeTensorMode() as mode:
        w = mode.from_tensor(torch.randn(4, 4)).requires_grad_()
        x = mode.from_tensor(torch.randn(2, 4))
    evaluator = FakeEvaluator(mode, cache=cache)
    for _ in range(2):  # a tensor built from remembered metadata would be an autograd leaf,
        out = evaluator.run(aten.mm.default, (x, w))  # which the in-place add refuses
        assert out.requires_grad and out.grad_fn is not None
        assert evaluator.run(aten.add_.Tensor, (out, x[:, :1])) is out
    assert cache.hits == 0
    layout = evaluator.run(aten.mm.default, (x, w), layout_only=True)  # its layout is known
    assert cache.hits == 1 and layout.device.type == "meta" and layout.shape == out.shape
    cache.hits = 0
    with torch.no_grad():  # without autograd the same call is remembered
        first = evaluator.run(aten.mm.default, (x, w))
        second = evaluator.run(aten.mm.default, (x, w))
    assert cache.hits == 1 and not second.requires_grad and same_value(first, second)


def test_real_tensors_become_fake_in_the_evaluators_mode(gm):
    evaluator = FakeEvaluator.for_graph(gm)
    value = evaluator.fake((torch.ones(2), 3))
    assert value[0].fake_mode is evaluator.mode and value[1] == 3
    assert evaluator.run(aten.add.Tensor, value[:1] * 2).shape == (2,)


def test_a_real_tensor_made_fake_in_a_programs_mode_has_static_sizes():
    # A symbolic size from a tensor with no source lands in the program's shape env, and
    # any guard on it then names '__meta_utils_unknown_tensorN' in the guards function of
    # every ExportedProgram rebuilt from the graph, so its .module() fails to run.
    ep = _models.exported()
    evaluator = FakeEvaluator.for_graph(ep.graph_module)
    env = evaluator.mode.shape_env
    before = dict(env.var_to_sources)
    fake = evaluator.fake(torch.randn(5, 7))
    with evaluator.mode:
        assert fake.reshape(35).shape == (35,)
    assert all(isinstance(size, int) for size in fake.shape)
    assert env.var_to_sources == before
    rebuilt = torch.export.ExportedProgram(
        ep.graph_module,
        ep.graph_module.graph,
        ep.graph_signature,
        ep.state_dict,
        ep.range_constraints,
        ep.module_call_graph,
        ep.example_inputs,
        constants=ep.constants,
    )
    rebuilt.module()(*ep.example_inputs[0])


def test_fake_value_is_the_evaluator_on_nodes(gm):
    mm = _mm(gm)
    assert same_value(fake_value(mm.target, mm.args, mm.kwargs), node_val(mm), grad=False)
    assert fake_value(mm.target, (mm.args[0], "x"), {}) is None
    with pytest.raises(RuntimeError, match="Expected a value of type 'Tensor'"):
        fake_value(mm.target, (mm.args[0], "x"), {}, strict=True)


def test_same_value_compares_metadata_and_can_leave_out_autograd():
    a, b = torch.empty(2, 3), torch.empty(2, 3, requires_grad=True)
    assert same_value(a, torch.empty(2, 3)) and not same_value(a, torch.empty(3, 2))
    assert not same_value(a, b) and same_value(a, b, grad=False)
    assert same_value((a, 1), (torch.empty(2, 3), 1)) and not same_value((a, 1), [a, 1])


def test_inside_a_dynamo_backend_ops_run_in_the_values_own_fake_mode():
    """While a backend runs, Dynamo's tracing context holds another fake mode than the
    graph's example values; an op on those values runs only in their own."""
    got = []

    def backend(gm, example_inputs):
        mul = next(n for n in gm.graph.nodes if n.op == "call_function")
        evaluator = FakeEvaluator(cache=None, new_mode=False)
        got.append(evaluator.rerun(mul, value=lambda n: n.meta.get("example_value")))
        return gm.forward

    torch._dynamo.reset()
    try:
        torch.compile(lambda x: x * 2, backend=backend, fullgraph=True)(torch.randn(3))
    finally:
        torch._dynamo.reset()
    assert got[0].shape == (3,)
