"""fxpass's SubgraphMatcher and replace_pattern_with_filters against torch's, on random
programs and patterns (tests/_random_programs.py): the same matches (as node-name maps, in
torch's order) under every matcher flag, and the same rewritten graphs and outputs under
filters, ``ignore_literals``, replacement callbacks and ``node_name_match``.

Where torch's own answer is wrong, fxpass is checked against the rules instead (every
match valid: ops and literals as in the pattern, one graph node per pattern node, inner
values used only inside, no cycle, no overlap when asked) — see docs/compat.md:

* torch raises ``KeyError`` when a pattern node is never bound: an anchor with no
  candidate at all while other anchors have some, or (``ignore_literals``) an op of the
  pattern set against a literal, which torch lets pass without binding it;
* torch returns a match whose nodes_map misses such a node when ``ignore_literals`` lets
  an op pattern "match" a literal;
* with ``remove_overlapping_matches=False`` torch returns matches whose fusion would form
  a cycle (it drops its own cycle filter's result on that path);
* torch's replace_pattern writes a graph that reads a value before making it when a
  pattern of two unconnected pieces has the later piece's input made between them (it
  inserts the whole replacement before the first reader of any output): fxpass inserts it
  after its last input and moves those readers behind it; the outputs are compared with
  torch's graph put in order.
"""

from __future__ import annotations

import copy
import random

import pytest
import torch
from _random_programs import (
    Chooser,
    cut_pattern,
    made_up_pattern,
    program_inputs,
    random_program,
    replacement_for,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.fx import Node
from torch.fx import subgraph_rewriter as torch_rewriter
from torch.fx.passes.tools_common import legalize_graph
from torch.fx.passes.utils import matcher_utils as torch_matcher

from fxpass.compat import fx as cfx

_SETTINGS = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _show(v):
    if isinstance(v, Node):
        return v.name
    if isinstance(v, (list, tuple)):
        return type(v)(_show(x) for x in v)
    return v


def _key(m):
    return (
        [a.name for a in m.anchors],
        [(k.name, _show(v)) for k, v in m.nodes_map.items()],
        [_show(n) for n in m.placeholder_nodes],
        [_show(n) for n in m.returning_nodes],
    )


# ----- the rules a match must follow ------------------------------------------------------
def _flat(n: Node) -> list:
    return [*n.args, *n.kwargs.values()]


def _agree(pa, ga, nodes_map, ignore_literals) -> bool:
    if isinstance(pa, Node):
        if pa.op == "placeholder":
            if ignore_literals and not isinstance(ga, Node):
                return True  # a literal of the graph is a wildcard
            return pa in nodes_map and (nodes_map[pa] is ga or nodes_map[pa] == ga)
        return nodes_map.get(pa) is ga
    if isinstance(pa, (list, tuple)) and isinstance(ga, (list, tuple)):
        return len(pa) == len(ga) and all(
            _agree(p, g, nodes_map, ignore_literals) for p, g in zip(pa, ga)
        )
    if ignore_literals and not isinstance(ga, (list, tuple)):
        return True
    return type(pa) is type(ga) and pa == ga


def _valid(matches, pattern, graph, *, match_placeholder, overlapping, ignore_literals, name):
    """Every match follows the matcher's rules; the problem, or None."""
    used: set[Node] = set()
    for m in matches:
        nm = m.nodes_map
        compute = {pn: gn for pn, gn in nm.items() if pn.op not in ("placeholder", "output")}
        for pn in pattern.nodes:
            if pn.op == "output":
                continue
            if pn not in nm:
                return f"{pn.name} unbound"
            gn = nm[pn]
            if pn.op == "placeholder":
                # (a literal binds a placeholder even then, as in torch)
                if match_placeholder and isinstance(gn, Node) and gn.op != "placeholder":
                    return f"placeholder {pn.name} bound to a non-placeholder"
                continue
            hit = bool(name) and name in gn.name and pn in m.anchors
            if not hit and (gn.op != pn.op or gn.target != pn.target):
                return f"{pn.name} bound to {gn.name}, another op"
            if not hit and not _agree(_flat(pn), _flat(gn), nm, ignore_literals):
                return f"{pn.name}'s arguments differ from {gn.name}'s"
        nodes = [v for v in nm.values() if isinstance(v, Node)]
        if len(set(nodes)) != len(nodes):
            return "two pattern nodes bound to one graph node"
        inner = set(compute.values())
        returning = set(m.returning_nodes)
        for gn in inner - returning:
            if any(u not in inner for u in gn.users):
                return f"{gn.name} is used outside the match"
        from torch.fx.passes.utils.fuser_utils import validate_partition

        if inner and not validate_partition(list(inner)):
            return "the match would form a cycle"
        if overlapping:
            if inner & used:
                return "overlapping matches"
            used |= inner
    return None


# ----- the matcher ------------------------------------------------------------------------
@st.composite
def _matcher_cases(draw):
    ch = Chooser.of(draw)
    gm = random_program(ch)
    pattern = cut_pattern(ch, gm) if ch.coin(0.75) else None
    pattern = pattern or made_up_pattern(ch)
    flags = dict(
        match_output=ch.coin(0.25),
        match_placeholder=ch.coin(0.4),
        remove_overlapping_matches=ch.coin(0.7),
        ignore_literals=ch.coin(0.25),
    )
    name = ch.choice(["", "", "", "select", "add", "neg", "getitem"])
    return gm, pattern, flags, name


def _compare_matches(gm, pattern, flags, name):
    g, p = gm.graph, pattern.graph
    ours = cfx.SubgraphMatcher(p, **flags).match(g, node_name_match=name)
    rules = dict(
        match_placeholder=flags["match_placeholder"],
        overlapping=flags["remove_overlapping_matches"],
        ignore_literals=flags["ignore_literals"],
        name=name,
    )
    try:
        theirs = torch_matcher.SubgraphMatcher(p, **flags).match(g, node_name_match=name)
    except KeyError:  # torch's fault (module docstring): ours must still be right
        assert _valid(ours, p, g, **rules) is None
        return
    if _valid(theirs, p, g, **rules) is not None:  # torch's fault: ours must be right
        assert _valid(ours, p, g, **rules) is None
        return
    assert [_key(m) for m in ours] == [_key(m) for m in theirs]


@_SETTINGS
@given(_matcher_cases())
def test_matches_equal_torchs(case):
    _compare_matches(*case)


# ----- the rewriter -----------------------------------------------------------------------
_FILTERS = {
    "none": None,
    # the node-name filters users write: on the match's inputs, on what it returns
    "inputs not a select": lambda m, g, p: (
        not any(isinstance(n, Node) and n.name.startswith("select") for n in m.placeholder_nodes)
    ),
    "inputs from a select": lambda m, g, p: any(
        isinstance(n, Node) and "select" in n.name for n in m.placeholder_nodes
    ),
    "returns no add": lambda m, g, p: all("add" not in n.name for n in m.returning_nodes),
}


@st.composite
def _rewrite_cases(draw):
    ch = Chooser.of(draw)
    gm = random_program(ch)
    pattern = cut_pattern(ch, gm) if ch.coin(0.8) else None
    pattern = pattern or made_up_pattern(ch)
    replacement = replacement_for(ch, pattern)
    options = dict(
        match_filters=[f] if (f := _FILTERS[ch.choice(list(_FILTERS))]) else None,
        ignore_literals=ch.coin(0.25),
        node_name_match=ch.choice(["", "", "", "select", "add"]),
    )
    callback = ch.coin(0.2)
    return gm, pattern, replacement, options, callback


def _rewrite(fn, gm, pattern, replacement, options, callback):
    if callback:
        return fn(
            gm, pattern, None, replacement_callback=lambda m, g, p: replacement.graph, **options
        )
    return fn(gm, pattern, replacement, **options)


def _replaced(r):
    return (
        r.anchor.name,
        [(k.name, _show(v)) for k, v in r.nodes_map.items()],
        [n.name for n in r.replacements],
    )


def _compare_rewrites(gm, pattern, replacement, options, callback):
    a, b = copy.deepcopy(gm), copy.deepcopy(gm)
    try:
        theirs = _rewrite(
            torch_rewriter.replace_pattern_with_filters, a, pattern, replacement, options, callback
        )
    except (KeyError, RuntimeError, AssertionError) as e:
        theirs = e
    try:
        ours = _rewrite(
            cfx.replace_pattern_with_filters, b, pattern, replacement, options, callback
        )
    except (KeyError, RuntimeError, AssertionError) as e:
        ours = e
    if isinstance(theirs, Exception):
        if isinstance(ours, Exception):
            assert type(ours) is type(theirs)
            return
        b.graph.lint()  # torch's fault: ours must give a program that runs like the original
        inputs = program_inputs(gm)
        b(*inputs)
        return
    assert not isinstance(ours, Exception), ours
    assert [_replaced(r) for r in ours] == [_replaced(r) for r in theirs]
    b.graph.lint()
    try:
        a.graph.lint()
    except RuntimeError:  # torch's fault: a value read before it is made; ours in order
        legalize_graph(a)
        a.recompile()
    else:
        assert b.code == a.code
    inputs = program_inputs(gm)
    try:
        expected = a(*inputs)
    except (TypeError, IndexError, RuntimeError) as e:
        # torch's graph cannot run either: node_name_match took a node of another op, or
        # ignore_literals put the pattern's literal (an index) where the graph had another
        with pytest.raises(type(e)):
            b(*inputs)
        return
    torch.testing.assert_close(b(*inputs), expected)


@_SETTINGS
@given(_rewrite_cases())
def test_rewrites_equal_torchs(case):
    _compare_rewrites(*case)


# ----- the classes the fuzzers found, pinned -----------------------------------------------
_FLAGS = dict(
    match_output=False,
    match_placeholder=False,
    remove_overlapping_matches=True,
    ignore_literals=False,
)


def _trace(fn):
    return torch.fx.symbolic_trace(fn)


def _counts(gm, pattern, name="", **flags):
    flags = {**_FLAGS, **flags}
    _compare_matches(gm, pattern, flags, name)
    theirs = torch_matcher.SubgraphMatcher(pattern.graph, **flags).match(gm.graph, name)
    return len(cfx.SubgraphMatcher(pattern.graph, **flags).match(gm.graph, name)), len(theirs)


def test_a_placeholder_used_twice_matches_with_match_placeholder():
    gm = _trace(lambda x1: torch.cat([x1, x1 + x1]))
    assert _counts(gm, _trace(lambda p0: p0 + p0), match_placeholder=True) == (1, 1)


def test_node_name_match_reaches_the_anchors_only():
    gm = _trace(lambda x: torch.neg(x + x))  # the neg's input is named "add"
    assert _counts(gm, _trace(lambda p0: torch.neg(p0)), "add", match_placeholder=True) == (0, 0)


def test_a_literal_binds_a_placeholder_even_with_match_placeholder():
    gm = _trace(lambda x: torch.sub(torch.sub(x, 2.0), -1.0))
    pattern = _trace(lambda p0, p1: torch.sub(torch.sub(p0, p1), -1.0))
    assert _counts(gm, pattern, match_placeholder=True) == (1, 1)


def test_ignore_literals_lets_a_literal_face_a_bound_placeholder():
    gm = _trace(lambda x: torch.relu(torch.sub(x, 2)))
    assert _counts(gm, _trace(lambda p0: torch.sub(p0, p0)), ignore_literals=True) == (1, 1)


def test_torch_raises_key_error_where_an_anchor_has_no_candidate():
    pattern = _trace(lambda x: (torch.relu(x), torch.neg(x)))
    gm = _trace(lambda x: torch.relu(x) * 2)
    with pytest.raises(KeyError):
        torch_matcher.SubgraphMatcher(pattern.graph).match(gm.graph)
    assert cfx.SubgraphMatcher(pattern.graph).match(gm.graph) == []
    _compare_matches(gm, pattern, _FLAGS, "")


def test_torch_returns_cyclic_matches_without_overlap_removal():
    def program(x):
        c = torch.cat([x, x])
        return torch.cat([torch.mul(c + c, c), c])

    def pattern(p0, p2):
        c = torch.cat([p0, p0])
        return torch.mul(p2, c), c

    gm, p = _trace(program), _trace(pattern)
    flags = {**_FLAGS, "remove_overlapping_matches": False}
    theirs = torch_matcher.SubgraphMatcher(p.graph, **flags).match(gm.graph)
    assert len(theirs) == 1  # mul <- add <- cat: fusing {cat, mul} makes a cycle
    assert cfx.SubgraphMatcher(p.graph, **flags).match(gm.graph) == []
    _compare_matches(gm, p, flags, "")


def test_a_replacement_goes_after_its_last_input():
    def program(x0):
        first = torch.chunk(x0, 2)[0]
        later = torch.chunk(torch.relu(x0) * 2, 2)
        return later[1], first

    def pattern(p0, p1):  # two unconnected pieces: the later one's input made between them
        return p1[1], torch.chunk(p0, 2)

    gm = _trace(program)
    ours, theirs = copy.deepcopy(gm), copy.deepcopy(gm)
    done = cfx.replace_pattern(ours, pattern, pattern)
    torch_rewriter.replace_pattern(theirs, pattern, pattern)
    assert len(done) == 1
    with pytest.raises(RuntimeError, match="used before it has been defined"):
        theirs.graph.lint()
    ours.graph.lint()
    v = torch.randn(4, 3)
    torch.testing.assert_close(ours(v), gm(v))


@pytest.mark.parametrize("seed", range(3))
def test_random_programs_run_and_cut_patterns_match_where_cut(seed):
    ch = Chooser(random.Random(seed))
    gm = random_program(ch, n_steps=6)
    gm(*program_inputs(gm))
    pattern = cut_pattern(ch, gm)
    assert pattern is not None
    matches = cfx.SubgraphMatcher(pattern.graph, remove_overlapping_matches=False).match(gm.graph)
    theirs = torch_matcher.SubgraphMatcher(pattern.graph, remove_overlapping_matches=False).match(
        gm.graph
    )
    assert [_key(m) for m in matches] == [_key(m) for m in theirs]
