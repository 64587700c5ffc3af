"""Checks after a pass: a check that also looks at the pass's input gets it, is told whether
the pass changed the graph, and names the pass when it fails (or is suppressed)."""

from __future__ import annotations

import pytest
import torch

import fxpass as fp


class _CountsNodes:
    """Fails when a pass that changed the graph grew it."""

    __name__ = "no_growth"

    def __init__(self):
        self.seen = []

    def __call__(self, gm):
        return None

    def before_pass(self, gm, p):
        return len(gm.graph.nodes)

    def after_pass(self, gm, p, before, changed):
        self.seen.append((p.name, before, changed))
        if changed and len(gm.graph.nodes) > before:
            raise AssertionError(f"{p.name} grew the graph from {before} nodes")


def _looks(gm):
    return False


def _grows(gm):
    x = next(n for n in gm.graph.nodes if n.op == "placeholder")
    with gm.graph.inserting_after(x):
        gm.graph.call_function(torch.neg, (x,))
    return True


def _gm():
    return torch.fx.symbolic_trace(lambda x: torch.relu(x))


def test_a_check_sees_each_pass_input_and_whether_it_changed():
    check = _CountsNodes()
    fp.Pipeline([_looks, fp.Pipeline([_looks])]).add_checks(check).run(_gm())
    assert check.seen == [("_looks", 3, False), ("_looks", 3, False)]  # leaf passes only


def test_a_failing_input_check_names_the_pass_and_rolls_back():
    gm = _gm()
    with pytest.raises(fp.CheckFailedError, match="check 'no_growth' failed after pass '_grows'"):
        fp.Pipeline([_looks, _grows]).add_checks(_CountsNodes()).run(gm)
    assert len(gm.graph.nodes) == 3


def test_a_suppressed_failure_is_recorded_and_warned_about():
    pipe = fp.Pipeline([_grows], suppress_check_failures=True).add_checks(_CountsNodes())
    with pytest.warns(UserWarning, match="suppressed check 'no_growth'"):
        result = pipe.run(_gm())
    assert result.report.suppressed == [
        "check 'no_growth' failed after pass '_grows': AssertionError: _grows grew the graph "
        "from 3 nodes"
    ]
