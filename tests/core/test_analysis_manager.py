"""The analysis manager: computed once per graph state, taken in or dropped on each change,
dropped after a pass unless preserved, verified by recomputation, counted in the report."""

from __future__ import annotations

import pytest
import torch

import fxpass as fp
from fxpass.core.analyses import aliasing, positions, users
from fxpass.core.analysis_manager import AnalysisManager, analysis, known_analyses, resolve

aten = torch.ops.aten


def _twice_relu(x):
    return torch.relu(x) + torch.relu(x) * 2


def _gm():
    return torch.fx.symbolic_trace(_twice_relu)


COMPUTED: list[str] = []


@analysis("test_relus")
def relus(graph):
    """The relu nodes, in graph order (counts its computations)."""
    COMPUTED.append("relus")
    return [n for n in graph.nodes if n.target is torch.relu]


def _asks(gm):
    relus(gm)
    relus(gm)
    return False


def _drops_a_relu(gm):
    """Replaces the second relu by the first through the editor (like cse)."""
    first, second = relus(gm)
    fp.current_context().editor.replace_all_uses(second, first, "merge")
    return True


def _drops_a_relu_directly(gm):
    """The same without the editor (the pipeline's fingerprint sees it)."""
    first, second = [n for n in gm.graph.nodes if n.target is torch.relu]
    second.replace_all_uses_with(first)
    gm.graph.erase_node(second)
    return None


def test_an_analysis_is_computed_once_and_served_from_the_cache():
    COMPUTED.clear()
    result = fp.Pipeline([_asks, _asks]).run(_gm())
    assert COMPUTED == ["relus"]
    assert result.report.analysis_counts() == {"_asks": {"test_relus": [1, 3]}}
    assert result.report.find("_asks").analyses == {"test_relus": [1, 1]}
    assert result.report.to_dict()["root"]["children"][0]["analyses"] == {"test_relus": [1, 1]}


def test_a_change_through_the_editor_drops_what_cannot_take_it_in():
    COMPUTED.clear()
    result = fp.Pipeline([_drops_a_relu, _asks]).run(_gm())
    assert COMPUTED == ["relus", "relus"]  # the pass's change dropped it; _asks recomputed
    assert len(relus(result.graph_module)) == 1


@pytest.mark.parametrize("edit", [_drops_a_relu, _drops_a_relu_directly])
def test_a_pass_that_changed_the_graph_drops_what_it_does_not_preserve(edit):
    COMPUTED.clear()
    result = fp.Pipeline([_asks, edit, _asks]).run(_gm())
    assert COMPUTED == ["relus", "relus"]  # once before the change, once after it
    assert result.report.analysis_counts()["_asks"] == {"test_relus": [2, 2]}


def test_an_insertion_without_the_editor_is_seen_at_the_next_request():
    def inserts_then_asks(gm):
        before = relus(gm)
        x = next(n for n in gm.graph.nodes if n.op == "placeholder")
        with gm.graph.inserting_after(x):
            gm.graph.call_function(torch.relu, (x,))
        return len(relus(gm)) == len(before) + 1

    COMPUTED.clear()
    assert fp.Pipeline([_asks, inserts_then_asks], lint=False).run(_gm()).modified
    assert COMPUTED == ["relus", "relus"]


def test_positions_and_aliasing_take_in_an_erasure_and_a_replaced_use():
    def merge(gm):
        pos, info = positions(gm), aliasing(gm)
        first, second = [n for n in gm.graph.nodes if n.target is torch.relu]
        fp.current_context().editor.replace_all_uses(second, first, "merge")
        ctx = fp.current_context()
        assert ctx.analyses.cached(positions, gm) is pos  # taken in, not dropped
        assert ctx.analyses.cached(aliasing, gm) is info
        assert second not in pos and second not in info.pos
        assert aliasing.equal(info, aliasing.compute(gm.graph))
        assert positions.equal(pos, positions.compute(gm.graph))
        return True

    merge.preserves = (positions, aliasing)
    fp.Pipeline([merge], verify_analyses=True).run(_gm())


def test_a_pass_that_lies_about_what_it_preserves_is_named():
    def lies(gm):
        positions(gm)
        relu = next(n for n in gm.graph.nodes if n.target is torch.relu)
        fp.current_context().editor.insert(
            torch.neg, (relu,), rule="neg", origin=[relu], after=relu
        )
        return True

    lies.preserves = (positions,)
    gm = _gm()
    before = gm.code
    with pytest.raises(fp.CheckFailedError) as err:
        fp.Pipeline([lies], verify_analyses=True).run(gm)
    msg = str(err.value).splitlines()[0]
    assert "check 'preserved analyses' failed after pass 'lies'" in msg
    assert "declares it preserves analysis 'positions'" in msg and "%" in msg
    assert gm.code == before  # rolled back
    fp.Pipeline([lies], verify_analyses=False).run(_gm())  # not checked: trusted


def test_a_pass_can_preserve_while_it_runs_and_dependents_follow_what_they_read():
    def keeps_users(gm):
        users(gm)  # reads positions: users depends on it
        ctx = fp.current_context()
        ctx.analyses.preserve(positions)  # MLIR's markAnalysesPreserved
        relu = next(n for n in gm.graph.nodes if n.target is torch.relu)
        ctx.editor.set_args(relu, (relu.args[0],), rule="same")  # a change nothing takes in
        assert ctx.analyses.cached(positions, gm) is not None  # preserved
        assert ctx.analyses.cached(users, gm) is None
        return True

    fp.Pipeline([keeps_users], verify_analyses=True).run(_gm())


def test_a_manager_without_a_cache_computes_every_request():
    manager = AnalysisManager(cache=False)
    gm = _gm()
    COMPUTED.clear()
    manager.get(relus, gm)
    manager.get("test_relus", gm)
    assert COMPUTED == ["relus", "relus"]
    assert manager.counts == {("(outside passes)", "test_relus"): [2, 0]}


def test_outside_a_run_an_analysis_is_computed():
    COMPUTED.clear()
    gm = _gm()
    assert relus(gm) == relus(gm.graph)
    assert COMPUTED == ["relus", "relus"]


def test_bad_names_and_declarations_are_clear_errors():
    assert {"positions", "users", "aliasing", "fake_values"} <= set(known_analyses())
    with pytest.raises(KeyError, match="no analysis named 'position'; did you mean 'positions'"):
        resolve("position")
    with pytest.raises(ValueError, match="'test_relus' is already registered"):
        analysis("test_relus")(lambda graph: None)
    with pytest.raises(TypeError, match="preserves= takes analyses"):
        fp.register("bad_preserves", preserves=[42])(lambda gm: False)
    with pytest.raises(ValueError, match="keeps unknown metadata 'stack'"):
        fp.register("bad_keeps", keeps=("stack",))(lambda gm: False)
    with pytest.raises(TypeError, match="GraphModule or Graph, not int"):
        positions(42)
