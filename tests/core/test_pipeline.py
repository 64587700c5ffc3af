"""The Pipeline: order, fixpoint, checks, rollback, one recompile, nesting."""

from __future__ import annotations

import pytest
import torch
from torch import fx

import fxpass as fp

aten = torch.ops.aten


def _nodes(gm, target):
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target is target]


def drop_asserts(gm):
    for n in _nodes(gm, aten._assert_tensor_metadata.default):
        gm.graph.erase_node(n)


def double_rsqrt(gm):
    """rsqrt(x) -> rsqrt(x) * 1.0: changes the graph, not the values."""
    for n in _nodes(gm, aten.rsqrt.default):
        with gm.graph.inserting_after(n):
            mul = gm.graph.call_function(aten.mul.Tensor, (n, 1.0))
        n.replace_all_uses_with(mul, delete_user_cb=lambda u, mul=mul: u is not mul)


# ----- order ----------------------------------------------------------------------------------
def test_constraints_reorder_passes_stably():
    def a(gm): ...
    def b(gm): ...
    def c(gm): ...

    pipe = fp.Pipeline([c, a, b]).this_before_that(b, c)
    assert [p.name for p in pipe.passes] == ["a", "b", "c"]
    pipe = fp.Pipeline([c, a, b], constraints=[("b", "a")])
    assert [p.name for p in pipe.passes] == ["c", "b", "a"]


def test_constraint_cycle_names_the_passes_in_it():
    def a(gm): ...
    def b(gm): ...
    def c(gm): ...
    def d(gm): ...

    pipe = fp.Pipeline([a, b, c, d], constraints=[(a, b), (b, c), (c, a)])
    with pytest.raises(fp.core.ConstraintCycleError) as err:
        _ = pipe.passes
    assert set(err.value.cycle) == {"a", "b", "c"}
    assert "a -> b -> c -> a" in str(err.value)


def test_torch_style_constraint_callables_are_accepted():
    from fxpass.compat.fx import this_before_that_pass_constraint

    def a(gm): ...
    def b(gm): ...

    pipe = fp.Pipeline([b, a], constraints=[this_before_that_pass_constraint(a, b)])
    assert [p.name for p in pipe.passes] == ["a", "b"]


# ----- fixpoint -------------------------------------------------------------------------------
def test_fixpoint_stops_when_a_round_honestly_changes_nothing(llama_gm):
    pipe = fp.Pipeline([fp.fixpoint(drop_asserts, max_iterations=10)])
    result = pipe.run(llama_gm)
    fixpoint = result.report.find("fixpoint")
    assert fixpoint.stats["iterations"] == 2  # round 1 removes asserts, round 2 sees no change
    assert fixpoint.children[0].runs == 2
    assert result.modified


def test_fixpoint_that_never_converges_warns_or_raises(llama_gm):
    code = llama_gm.code
    with pytest.warns(UserWarning, match="still changed the graph after 3 iterations"):
        fp.Pipeline([fp.fixpoint(double_rsqrt, max_iterations=3)]).run(llama_gm)
    fresh = fx.GraphModule(llama_gm, llama_gm.graph)
    with pytest.raises(fp.PassFailedError, match="NonConvergenceError") as err:
        fp.Pipeline([fp.fixpoint(double_rsqrt, max_iterations=3, strict=True)]).run(fresh)
    assert err.value.pass_name == "fixpoint"
    assert code != llama_gm.code  # the non-strict run kept its changes


# ----- checks ---------------------------------------------------------------------------------
def test_lint_catches_a_pass_that_breaks_the_graph(llama_gm):
    def break_graph(gm):
        first = next(iter(_nodes(gm, aten.rsqrt.default)))
        first.args = (first,)  # a node using itself

    code = llama_gm.code
    with pytest.raises(
        fp.core.CheckFailedError, match="check 'lint' failed after pass 'break_graph'"
    ):
        fp.Pipeline([drop_asserts, break_graph]).run(llama_gm)
    assert llama_gm.code == code


def test_user_check_failure_names_pass_and_earlier_passes(llama_gm):
    def no_sqrt(gm):
        if _nodes(gm, aten.sqrt.default):
            raise ValueError("sqrt is not supported by this backend")

    def make_rsqrt_sqrt(gm):
        for n in _nodes(gm, aten.rsqrt.default):
            n.target = aten.sqrt.default

    pipe = fp.Pipeline([drop_asserts, double_rsqrt, make_rsqrt_sqrt])
    pipe.add_checks(no_sqrt)
    before = [n.name for n in llama_gm.graph.nodes]
    with pytest.raises(fp.core.CheckFailedError) as err:
        pipe.run(llama_gm)
    assert err.value.pass_name == "make_rsqrt_sqrt"
    assert err.value.check_name == "no_sqrt"
    assert err.value.ran_before == ["drop_asserts", "double_rsqrt"]
    assert "passes that ran before it: drop_asserts, double_rsqrt\n" in str(err.value)
    assert [n.name for n in llama_gm.graph.nodes] == before


def test_checks_run_on_the_input_first(llama_gm):
    pipe = fp.Pipeline([drop_asserts]).add_checks(lambda gm: False)
    with pytest.raises(fp.core.CheckFailedError, match="on the input graph, before any pass ran"):
        pipe.run(llama_gm)


def test_suppressed_check_failures_are_reported_and_warned(llama_gm):
    def always_fails(gm):
        raise AssertionError("nope")

    pipe = fp.Pipeline([drop_asserts], suppress_check_failures=True).add_checks(always_fails)
    with pytest.warns(UserWarning, match="suppressed check 'always_fails' failed"):
        result = pipe.run(llama_gm)
    assert result.modified
    assert len(result.report.suppressed) == 2  # on the input, and after drop_asserts
    assert "after pass 'drop_asserts'" in result.report.suppressed[1]
    assert "suppressed" in str(result.report)


def test_invariants_a_pass_declares_hold_for_the_rest_of_the_run(llama_gm):
    seen = []

    def no_sqrt(gm):
        seen.append(len(gm.graph.nodes))
        if _nodes(gm, aten.sqrt.default):
            raise ValueError("sqrt is not supported after double_rsqrt")

    def declares(gm):
        return double_rsqrt(gm)

    declares.invariants = (no_sqrt,)

    def make_rsqrt_sqrt(gm):
        for n in _nodes(gm, aten.rsqrt.default):
            n.target = aten.sqrt.default

    before = [n.name for n in llama_gm.graph.nodes]
    assert fp.Pipeline([drop_asserts, declares]).run(llama_gm).modified
    assert len(seen) == 1  # checked after the pass that declared it, not before
    with pytest.raises(fp.core.CheckFailedError) as err:
        fp.Pipeline([declares, drop_asserts, make_rsqrt_sqrt]).run(llama_gm)
    assert err.value.pass_name == "make_rsqrt_sqrt" and err.value.check_name == "no_sqrt"
    assert [n.name for n in llama_gm.graph.nodes] != before  # the first run's changes stay
    assert fp.Pipeline([make_rsqrt_sqrt]).run(llama_gm).modified  # not installed: no check


def test_checks_off_skips_lint_and_user_checks(llama_gm):
    pipe = fp.Pipeline([drop_asserts], run_checks_after_each_pass=False)
    pipe.add_checks(lambda gm: False)
    assert pipe.run(llama_gm).modified


# ----- nothing lost ---------------------------------------------------------------------------
def test_pass_raising_halfway_leaves_the_module_exactly_as_it_was(llama_ep):
    gm = llama_ep.graph_module
    inputs = (*llama_ep.state_dict.values(), *llama_ep.constants.values())
    example = torch.randint(0, 128, (1, 8))
    expected = gm(*inputs, example)
    nodes = list(gm.graph.nodes)
    state = [(n.name, n.op, n.target, n.args, n.kwargs, list(n.users), dict(n.meta)) for n in nodes]
    code, graph_text = gm.code, str(gm.graph)

    def half_then_raise(gm):
        drop_asserts(gm)
        double_rsqrt(gm)
        gm.graph.call_function(aten.relu.default, (nodes[0],))
        gm.register_buffer("junk", torch.zeros(1))
        gm.graph.lint()
        gm.recompile()
        raise RuntimeError("failed halfway")

    with pytest.raises(fp.PassFailedError) as err:
        fp.Pipeline([drop_asserts, half_then_raise]).run(gm)
    assert err.value.ran_before == ["drop_asserts"]
    assert "restored" in str(err.value)
    assert list(gm.graph.nodes) == nodes
    assert [
        (n.name, n.op, n.target, n.args, n.kwargs, list(n.users), dict(n.meta)) for n in nodes
    ] == state
    assert gm.code == code and str(gm.graph) == graph_text
    assert not hasattr(gm, "junk")
    torch.testing.assert_close(gm(*inputs, example), expected)


def test_error_of_a_nested_pass_lists_every_pass_that_ran(llama_gm):
    def boom(gm):
        raise KeyError("x")

    inner = fp.Pipeline([double_rsqrt, boom], name="inner")
    with pytest.raises(fp.PassFailedError) as err:
        fp.Pipeline([drop_asserts, inner]).run(llama_gm)
    assert err.value.pass_name == "boom"
    assert err.value.ran_before == ["drop_asserts", "double_rsqrt"]
    assert err.value.report.find("boom").status == "failed"


# ----- no wasted recompiles --------------------------------------------------------------------
def test_code_is_generated_once_when_first_needed(llama_gm, monkeypatch):
    calls = []
    real = fx.GraphModule.recompile

    def counting(self):
        calls.append(self)
        return real(self)

    monkeypatch.setattr(fx.GraphModule, "recompile", counting)

    def recompiling_pass(gm):
        double_rsqrt(gm)
        gm.recompile()  # Torch-TensorRT style: passes recompile themselves

    def lowering(gm, sample_inputs):
        drop_asserts(gm)
        gm.recompile()
        return gm

    result = fp.Pipeline([recompiling_pass, lowering, recompiling_pass]).run(llama_gm)
    assert result.modified
    assert calls == []  # the run generated no code: the module's code is lazy
    assert llama_gm.code.count("aten.mul.Tensor(rsqrt") > 0
    assert "_assert_tensor_metadata" not in str(llama_gm)
    assert len(calls) == 1  # generated once, when first read
    assert "recompile" not in llama_gm.__dict__


def test_a_pass_that_runs_the_module_sees_fresh_code(llama_ep):
    gm = llama_ep.graph_module
    args = (*llama_ep.state_dict.values(), *llama_ep.constants.values(), torch.zeros(1, 8).long())
    seen = {}

    class RunsIt(fp.Pass):
        needs_code = True

        def call(self, gm):
            seen["code"] = gm.code
            return False

    def calls_module(gm):
        seen["out"] = gm(*args)  # runs the graph mid-pipeline: regenerated on demand
        return False

    fp.Pipeline([drop_asserts, RunsIt(), double_rsqrt, calls_module]).run(gm)
    assert "_assert_tensor_metadata" not in seen["code"]
    assert seen["out"] is not None


def test_unchanged_run_does_not_recompile(llama_gm, monkeypatch):
    calls = []
    monkeypatch.setattr(fx.GraphModule, "recompile", lambda self: calls.append(self))
    fp.Pipeline([lambda gm: None, lambda gm: False]).run(llama_gm)
    assert calls == []


# ----- misc -----------------------------------------------------------------------------------
def test_disabled_registered_pass_is_skipped(llama_gm):
    @fp.register("test_pipeline_drop_asserts")
    def test_pipeline_drop_asserts(gm):
        """Drop asserts (test)."""
        drop_asserts(gm)

    try:
        fp.registry.disable("test_pipeline_drop_asserts")
        result = fp.Pipeline.parse("test_pipeline_drop_asserts").run(llama_gm)
        assert result.report.passes[0].status == "skipped"
        assert not result.modified
        fp.registry.enable("test_pipeline_drop_asserts")
        assert fp.Pipeline.parse("test_pipeline_drop_asserts").run(llama_gm).modified
    finally:
        fp.registry.unregister("test_pipeline_drop_asserts")


def test_run_rejects_a_plain_module():
    with pytest.raises(TypeError, match="capture the model first"):
        fp.Pipeline([]).run(torch.nn.Linear(2, 2))


def test_a_pipeline_run_inside_a_pass_joins_the_outer_run(llama_gm):
    inner = fp.Pipeline([drop_asserts])

    def runs_inner(gm):
        return inner.run(gm)

    result = fp.Pipeline([runs_inner]).run(llama_gm)
    assert result.modified
    assert "_assert_tensor_metadata" not in llama_gm.code


def test_a_spec_string_given_as_the_pass_list_points_to_parse():
    with pytest.raises(TypeError, match=r"for a textual spec use Pipeline.parse\('cse,dce'\)"):
        fp.Pipeline("cse,dce")


# ----- nesting: a documented limit, checked where a pipeline is made and before it runs -------
def _tower(depth: int, leaf=drop_asserts) -> fp.Pipeline:
    """Pipelines nested ``depth`` levels deep around ``leaf`` (``fixpoint(...)`` alternating)."""
    pipe = fp.Pipeline([leaf])
    for i in range(depth):
        pipe = fp.fixpoint(pipe) if i % 2 == 0 else fp.Pipeline([pipe])
    return pipe


def test_pipelines_nested_to_the_limit_run_and_print(llama_gm):
    from fxpass.core.run import MAX_NESTING, nesting

    pipe = _tower(MAX_NESTING)
    assert nesting(pipe) == MAX_NESTING
    result = pipe.run(llama_gm)
    assert result.modified
    assert "_assert_tensor_metadata" not in llama_gm.code
    text = str(pipe)
    assert text.count("(") == MAX_NESTING  # the outermost pipeline is not written
    assert str(fp.Pipeline.parse(text)) == text
    assert result.report.to_dict()  # the report walks the same depth


def test_one_level_deeper_is_a_nesting_error_where_it_is_made():
    from fxpass.core.run import MAX_NESTING

    with pytest.raises(fp.core.NestingError, match=f"more than {MAX_NESTING} levels deep"):
        fp.Pipeline([_tower(MAX_NESTING)])
    deep = _tower(MAX_NESTING)
    top = fp.Pipeline(["cse"])
    with pytest.raises(fp.core.NestingError):
        top.add(deep)
    assert [p.name for p in top.passes] == ["cse"]  # the refused pass was not kept
    with pytest.raises(fp.core.NestingError):
        top.set_passes([deep])
    assert [p.name for p in top.passes] == ["cse"]


def test_a_group_deepened_after_it_was_nested_is_refused_before_the_run(llama_gm):
    from fxpass.core.run import MAX_NESTING

    inner = fp.Pipeline([drop_asserts])
    outer = fp.Pipeline([inner])
    inner.add(_tower(MAX_NESTING - 1))  # inner is fine on its own; outer is now too deep
    before = llama_gm.code
    with pytest.raises(fp.core.NestingError):
        outer.run(llama_gm)
    assert llama_gm.code == before


def test_a_pipeline_that_holds_itself_is_refused():
    pipe = fp.Pipeline(["cse"])
    with pytest.raises(fp.core.NestingError):
        pipe.add(pipe)
    assert len(pipe) == 1
