"""``register_replacement`` and ``PatternMatcherPass.apply`` against Inductor's, on random
programs and patterns (:mod:`_random_patterns`): where Inductor succeeds, the same matches,
the same graph (dead code included) and the same outputs; where it fails, the same failure or
a valid graph (:mod:`_differential` says exactly what is compared). The cases below it are
the classes the random cases found, each as a small program of its own."""

from __future__ import annotations

import copy
import random

import pytest
import torch
from _differential import compare, outcome, program_graph, signatures
from _ind_support import MATCHERS, make_graph, pattern_matcher
from _random_patterns import Case, random_case
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import fxpass.compat.inductor as fxi

aten = torch.ops.aten


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(st.integers(0, 2**32 - 1), st.booleans())
def test_random_patterns_leave_what_inductor_leaves(seed, dynamic):
    case = random_case(random.Random(seed))
    verdict = compare(case, dynamic)
    event(f"{case.kind}{' (dynamic)' if dynamic else ''}: {verdict.kind}")
    assert verdict.agree, f"{verdict}\n{case.source}"


def _case(source: str, shapes: list, search_shapes: list, *, equivalent=True) -> Case:
    env: dict = {}
    exec(compile(source, "<case>", "exec"), {"torch": torch}, env)
    inputs = [torch.randn(s) for s in shapes]
    examples = [torch.randn(s) for s in search_shapes]
    return Case(
        env["program"], inputs, env["search"], env["replacement"], source, equivalent, "", examples
    )


def _both(case: Case):
    gm = make_graph(case.program, *case.inputs)
    return {m: outcome(m, case, gm) for m in MATCHERS}


UNANCHORED = """
def program(a, b):
    return a.sum() + (b + 1.0).sum(), a + 1.0

def search(x0, x1):
    return x1.sum(), x0 + 1.0

def replacement(x0, x1):
    return x1.sum() * 2.0, x0 + 2.0
"""


def test_an_output_sharing_nothing_with_the_others_registers_and_never_matches():
    """Inductor finds each later output of a MultiOutputPattern from what the ones before it
    matched; one sharing no node and no argument with them has no anchor: registered, it
    matches nowhere — even where the graph has both parts."""
    case = _case(UNANCHORED, [(3, 4), (3, 4)], [(3, 4), (3, 4)])
    results = _both(case)
    assert [(r.stage, r.count) for r in results.values()] == [("ok", 0), ("ok", 0)]
    assert compare(case).agree
    p = fxi.PatternMatcherPass()
    fxi.register_replacement(case.search, case.replacement, case.search_inputs, fxi.fwd_only, p)
    assert "no anchor found" in str(p.explain(make_graph(case.program, *case.inputs)))


def test_an_output_that_is_an_unread_input_never_matches():
    source = """
def program(a, b):
    return a.sum(), b * 2.0

def search(x0, x1):
    return x0.sum(), x1

def replacement(x0, x1):
    return x0.sum(), x1
"""
    case = _case(source, [(3, 4), (3, 4)], [(3, 4), (3, 4)])
    assert [(r.stage, r.count) for r in _both(case).values()] == [("ok", 0), ("ok", 0)]


CAT_TWICE = """
def program(a0, a1):
    v0 = torch.cat([a0, a1])
    v1 = torch.cat([v0, v0])
    return v1 * v1, v0

def search(x0, x1):
    t0 = torch.cat([x0, x1])
    t1 = torch.cat([t0, t0])
    return t1, t0

def replacement(x0, x1):
    t0 = torch.cat([x0, x1])
    return torch.cat([t0, t0]), t0
"""


def test_sizes_of_inner_values_are_not_checked_and_static_ones_are_folded():
    """``cat([t, t])`` decomposes into unsqueeze/expand/clone/view whose sizes are computed
    from ``t``'s (an inner value): the fast check of a match accepts any there, as the
    re-traced pattern does; the replacement's sizes are numbers in a static graph, never
    ``sym_size``/``sym_numel`` nodes Inductor's replacement does not have."""
    case = _case(CAT_TWICE, [(2, 4), (2, 4)], [(2, 4), (2, 4)])
    results = _both(case)
    assert results["inductor"].count == results["fxpass"].count == 1
    assert signatures(results["inductor"].gm) == signatures(results["fxpass"].gm)
    queries = {aten.sym_size.int, aten.sym_numel.default, aten.sym_stride.int}
    assert not [n for n in results["fxpass"].gm.graph.nodes if n.target in queries]
    assert compare(case).agree


def test_a_size_computed_from_an_output_does_not_block_the_match():
    """With symbolic sizes, the second ``cat``'s view reads a size computed from the first
    ``cat`` (an output of the match) outside the match: Inductor replaces it (leaving that
    size computation dead), and so does fxpass — the replacement reads the bound inputs
    alone, so the path back into the match goes with it; its own sizes stay symbolic."""
    case = _case(CAT_TWICE, [(2, 4), (2, 4)], [(2, 4), (2, 4)])
    assert compare(case, dynamic=True).agree
    gm = program_graph(case, dynamic=True)
    ours = outcome("fxpass", case, gm)
    assert ours.count == 1
    assert ours.gm.graph.find_nodes(op="call_function", target=aten.sym_size.int)
    a, b = torch.randn(3, 4), torch.randn(5, 4)
    for got, want in zip(ours.gm(a, b), case.program(a, b)):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("dynamic", [False, True])
def test_a_value_matched_twice_does_not_stand_for_two(dynamic):
    """``x0 * x1`` matches ``v * v`` first (the walk goes from the last node): traced for
    that match, the search function reads one input twice (``x1 * x1``). That trace is not
    the one for a match binding two values (``a * b``), which Inductor re-traces for."""
    source = """
def program(a, b):
    v = a * b
    return v * v

def search(x0, x1):
    return x0 * x1

def replacement(x0, x1):
    return x1 * x0
"""
    case = _case(source, [(3, 3), (3, 3)], [(3, 3), (3, 3)])
    assert compare(case, dynamic).agree
    assert outcome("fxpass", case, program_graph(case, dynamic)).count == 2


def test_a_bound_value_computed_from_an_output_blocks_only_a_replacement_reading_it():
    """``x2`` is bound to ``a0 * sub``, computed from the match's output ``sub``: a
    replacement that does not read ``x2`` is applied, as Inductor applies it; one that reads
    it would form a cycle, and is not (Inductor's graph then reads a value before it is
    defined)."""
    source = """
def program(a0, a1):
    v0 = a0 - a1
    v1 = a0 * v0
    v2 = v0 + v1
    return torch.neg(v1), v2

def search(x0, x1, x2):
    t0 = x0 - x1
    return t0 + x2, t0

def replacement(x0, x1, x2):
    return x0, x0
"""
    case = _case(source, [(3, 4), (3, 4)], [(3, 4)] * 3, equivalent=False)
    assert compare(case).agree
    assert outcome("fxpass", case, program_graph(case)).count == 1
    reads = _case(
        source.replace("return x0, x0", "return x0 - x1 + x2, x0 - x1"), [(3, 4)] * 2, [(3, 4)] * 3
    )
    results = _both(reads)
    assert results["inductor"].stage == "run"
    assert (results["fxpass"].stage, results["fxpass"].count) == ("ok", 0)
    assert compare(reads).agree


# ----- where Inductor fails: fxpass leaves a valid graph ----------------------------------
def test_a_float_bound_where_the_replacement_needs_a_tensor_is_no_match():
    """``x0 + x1`` matches ``a + 0.5`` with ``x1 = 0.5``; a replacement calling
    ``torch.neg(x1)`` cannot be traced with a float: Inductor raises ``TypeError`` from
    ``apply``; fxpass leaves that site alone and replaces the others."""
    source = """
def program(a0):
    v1 = a0 + 0.5
    return a0 + v1, v1

def search(x0, x1):
    return x0 + x1

def replacement(x0, x1):
    return x0 - torch.neg(x1)
"""
    case = _case(source, [(3, 4)], [(3, 4), (3, 4)])
    results = _both(case)
    assert results["inductor"].stage == "apply" and results["inductor"].error_type == "TypeError"
    assert (results["fxpass"].stage, results["fxpass"].count) == ("ok", 1)
    assert compare(case).agree


def test_a_replacement_returning_a_bound_float_fails_as_inductor_s():
    """``x1 + x0`` matches ``a0 + -1.0`` with ``x0 = -1.0``; a replacement returning ``x0``
    returns a number, not a value of the graph: Inductor fails in ``apply`` with a
    ``TypeError`` (by accident, taking its length); fxpass says why, with an error that is a
    ``TypeError`` too (found by the inductor fuzzer)."""
    source = """
def program(a0):
    v1 = a0 + -1.0
    return a0 + v1, v1

def search(x0, x1):
    return x1 + x0

def replacement(x0, x1):
    return x0
"""
    case = _case(source, [(3, 4)], [(3, 4), (3, 4)])
    results = _both(case)
    assert results["inductor"].stage == "apply" and results["inductor"].error_type == "TypeError"
    ours = results["fxpass"]
    assert ours.stage == "apply" and "must return graph values" in ours.error
    assert "TypeError" in ours.error_types
    assert compare(case).agree


def test_a_search_function_returning_its_input_leaves_the_input_alone():
    """An output of the search function that is one of its inputs: Inductor replaces the
    input's readers with the replacement's value, the replacement's own reader included (a
    graph that reads a value before it is defined); fxpass leaves the input's readers as
    they are."""
    source = """
def program(a0, a1):
    return torch.relu(a0) + a1, a0 * 2.0

def search(x0):
    return torch.relu(x0), x0

def replacement(x0):
    return torch.clamp_min(x0, 0.0), x0
"""
    case = _case(source, [(3, 4), (3, 4)], [(3, 4)])
    results = _both(case)
    assert results["inductor"].stage == "run" and "before it has been defined" in (
        results["inductor"].error
    )
    assert (results["fxpass"].stage, results["fxpass"].count) == ("ok", 1)
    assert compare(case).agree


@pytest.mark.parametrize("dynamic", [False, True])
def test_readers_of_an_input_returned_by_the_search_function_stay_where_they_are(dynamic):
    """The search function returns its input ``x0`` (``relu``) besides ``x2 * cat(x0, x1)``:
    the readers of ``relu`` — ``x2`` among them — are not moved behind the replacement (it
    would then read ``x2`` before it is defined)."""
    source = """
def program(a0, a1):
    v1 = torch.relu(a1)
    v2 = torch.cat([a1, a0])
    v3 = torch.cat([v1, a1])
    v4 = torch.cat([a1, v1])
    return v4 * v3, v2, v4

def search(x0, x1, x2):
    t0 = torch.cat([x0, x1])
    return x2 * t0, x0

def replacement(x0, x1, x2):
    return torch.cat([x0, x1], 0) * x2, x0
"""
    case = _case(source, [(3, 4), (3, 4)], [(3, 4), (3, 4), (6, 4)])
    ours = outcome("fxpass", case, program_graph(case, dynamic))
    assert (ours.stage, ours.count) == ("ok", 1), ours.error
    assert compare(case, dynamic).agree


def test_a_multi_output_replacement_goes_in_before_the_last_output():
    """Inductor puts a multi-output replacement before the earliest output of the match: an
    input of the match computed after that output is read before it is defined."""
    source = """
def program(a0, a1):
    v0 = a0 * 2.0
    w = torch.relu(a1)  # an input of the match, after its first output
    v1 = v0 + w
    return v1 * v0

def search(x0, x1):
    t0 = x0 * 2.0
    return t0 + x1, t0

def replacement(x0, x1):
    t0 = x0 + x0
    return t0 + x1, t0
"""
    case = _case(source, [(3, 4), (3, 4)], [(3, 4), (3, 4)])
    results = _both(case)
    assert results["inductor"].stage == "run" and "before it has been defined" in (
        results["inductor"].error
    )
    assert (results["fxpass"].stage, results["fxpass"].count) == ("ok", 1)
    assert compare(case).agree


@pytest.mark.parametrize("matcher", MATCHERS)
def test_an_unused_search_input_fails_as_inductor_s(matcher):
    """A search function that ignores one of its inputs: both raise Inductor's error when
    a match is applied."""
    pm = pattern_matcher(matcher)
    p = pm.PatternMatcherPass()
    pm.register_replacement(
        lambda x0, x1: torch.relu(x1),
        lambda x0, x1: torch.clamp_min(x1, 0.0),
        [torch.randn(3), torch.randn(3)],
        pm.fwd_only,
        p,
    )
    gm = make_graph(lambda a: torch.relu(a) * 2, torch.randn(3))
    with pytest.raises(RuntimeError, match="Not all inputs to pattern found"):
        p.apply(copy.deepcopy(gm).graph)
