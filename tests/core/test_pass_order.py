"""The one pass-ordering sort: earliest ready first, or torch's first-in-first-out."""

import pytest

import fxpass as fp
from fxpass.core.pass_order import topological_order


def test_earliest_ready_first_and_torchs_queue():
    # 1 before 0, 3 before 2: the heap takes 0 as soon as 1 ran, torch's queue takes 3 first
    succ = [[], [0], [], [2]]
    assert topological_order(succ) == ([1, 0, 3, 2], [0, 0, 0, 0])
    assert topological_order(succ, fifo=True)[0] == [1, 3, 0, 2]


def test_a_cycle_leaves_its_passes_out():
    order, indegree = topological_order([[1], [0], []])
    assert order == [2] and indegree[:2] == [1, 1]


def test_the_pipeline_sorts_with_it_and_names_a_cycle():
    def a(gm):
        return None

    def b(gm):
        return None

    pipe = fp.Pipeline([a, b]).this_before_that(b, a)
    assert [p.name for p in pipe.passes] == ["b", "a"]
    pipe.this_before_that(a, b)
    with pytest.raises(fp.core.ConstraintCycleError, match="a"):
        _ = pipe.passes
