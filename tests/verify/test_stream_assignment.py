"""The stream_assignment analysis: it agrees with a plain replay of set_stream on the pass's
schedules and on random ones, takes in the editor's changes that involve no set_stream (and
only those), and is cached, dropped and verified by a pipeline like the standard analyses."""

from __future__ import annotations

import pytest
import torch
from _streams import hand_schedule, random_dag, scheduled
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import fx

import fxpass as fp
from fxpass.edit.alias import is_kernel
from fxpass.edit.editor import Editor
from fxpass.verify.stream_assignment import StreamAssignment, stream_assignment

OPS = torch.ops.fxpass
aten = torch.ops.aten


def replay(graph: fx.Graph) -> tuple[dict[fx.Node, int], list[fx.Node]]:
    """The streams by the definition, written out: each node on the stream the last
    constant set_stream before it named (a set_stream: the one it names), else 0; and the
    stream ops with a non-constant number."""
    on, bad, current = {}, [], 0
    numbers = {OPS.set_stream.default: 1, OPS.record_event.default: 2,
               OPS.wait_event.default: 2, OPS.record_stream.default: 1}  # fmt: skip
    for node in graph.nodes:
        if node.op == "call_function" and node.target in numbers:
            args = node.args[1:] if node.target is OPS.record_stream.default else node.args
            constant = len(args) == numbers[node.target] and all(type(a) is int for a in args)
            if not constant:
                bad.append(node)
            elif node.target is OPS.set_stream.default:
                current = args[0]
        on[node] = current
    return on, bad


def _agrees(gm: fx.GraphModule) -> StreamAssignment:
    sa = stream_assignment(gm)
    on, bad = replay(gm.graph)
    assert dict(sa) == on and sa.bad == bad
    kernels = [n for n in gm.graph.nodes if is_kernel(n)]
    assert sorted(n for ks in sa.kernels.values() for n in ks) == sorted(kernels)
    for stream, ks in sa.kernels.items():
        assert all(on[n] == stream for n in ks)
        assert ks == [n for n in kernels if on[n] == stream]  # in graph order
    assert set(sa.streams) >= {0, *on.values()}
    return sa


# ----- agreement -----------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["moe", "parallel"])
def test_the_scheduled_decoders_agree_with_the_replay_and_the_schedules_marks(name):
    gm, result = scheduled(name)
    sa = _agrees(gm)
    stats = result.report.find("multi_stream").stats
    assert sa.streams == [0, 1] and sa.bad == []
    assert len(sa.kernels[1]) == stats["side_kernels"] > 0
    # the pass marks each kernel with the stream it planned: the set_streams put it there
    assert all(n.meta["stream"] == sa[n] for ks in sa.kernels.values() for n in ks)
    assert len(sa.stream_ops) == sum(n.target in OPS_ALL for n in gm.graph.nodes)


OPS_ALL = {OPS.set_stream.default, OPS.record_event.default, OPS.wait_event.default,
           OPS.record_stream.default}  # fmt: skip
_settings = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_settings
@given(data=st.data())
def test_random_hand_schedules_agree_with_the_replay(data):
    gm, _ = random_dag(data.draw, st)
    hand_schedule(data.draw, st, gm)
    _agrees(gm)


def test_a_set_stream_of_a_non_constant_changes_nothing_and_is_named():
    graph = fx.Graph()
    x = graph.placeholder("x")
    graph.call_function(OPS.set_stream.default, (2,))
    a = graph.call_function(aten.relu.default, (x,))
    bad = graph.call_function(OPS.set_stream.default, (x,))
    b = graph.call_function(aten.relu.default, (a,))
    graph.call_function(OPS.record_stream.default, (b, 3))
    graph.output(b)
    sa = stream_assignment(graph)
    assert (sa[x], sa[a], sa[bad], sa[b]) == (0, 2, 2, 2)
    assert sa.bad == [bad] and sa.numbers(bad) is None and sa.streams == [0, 2, 3]


# ----- taking in the editor's changes --------------------------------------------------------
class _Absorbs:
    """An edit listener that offers each change to one StreamAssignment."""

    pass_path: list[str] = []

    def __init__(self, sa: StreamAssignment) -> None:
        self.sa, self.kept = sa, True

    def allow(self) -> bool:
        return True

    def notify(self, event) -> None:
        self.kept = self.sa.absorb(event) and self.kept


def _edit(draw, graph: fx.Graph, editor: Editor) -> bool:
    """One random change through ``editor``; whether it involved a set_stream."""
    nodes = [n for n in graph.nodes if n.op not in ("placeholder", "output")]
    x = next(iter(graph.nodes))
    kinds = ["insert", "insert_set_stream"]
    kinds += ["erase", "move", "replace", "set_args"] if nodes else []
    kind = draw(st.sampled_from(kinds))
    if kind.startswith("insert"):
        anchor = draw(st.sampled_from([*nodes, graph.output_node()]))
        if kind == "insert_set_stream":
            target, args = OPS.set_stream.default, (draw(st.integers(0, 3)),)
        else:
            target, args = draw(st.sampled_from([
                (aten.relu.default, (x,)), (OPS.record_event.default, (9, 1)),
                (OPS.wait_event.default, (9, 2)), (OPS.record_stream.default, (x, 1)),
            ]))  # fmt: skip
        editor.insert(target, args, rule="t", origin=[x], before=anchor, val=None)
        return target is OPS.set_stream.default
    node = draw(st.sampled_from(nodes))
    if kind == "erase":
        dead = [n for n in nodes if not n.users]
        node = draw(st.sampled_from(dead)) if dead else node
        if node.users:
            return _edit(draw, graph, editor)
        editor.erase(node, "t")
    elif kind == "move":
        editor.move(node, before=draw(st.sampled_from([*nodes, graph.output_node()])), rule="t")
    elif kind == "replace":
        if not node.users:
            return _edit(draw, graph, editor)
        editor.replace_all_uses(node, x, "t")
    elif node.target is OPS.set_stream.default:
        editor.set_args(node, (draw(st.integers(0, 3)),), rule="t")
    elif node.target in (OPS.record_event.default, OPS.wait_event.default):
        editor.set_args(node, (draw(st.integers(0, 3)), draw(st.sampled_from([1, x]))), rule="t")
    else:
        return _edit(draw, graph, editor)
    return node.target is OPS.set_stream.default


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_it_takes_in_every_change_without_a_set_stream_and_drops_the_rest(data):
    gm, _ = random_dag(data.draw, st)
    hand_schedule(data.draw, st, gm)
    for _ in range(data.draw(st.integers(1, 8))):
        listener = _Absorbs(StreamAssignment(gm.graph))
        _ = listener.sa.streams, listener.sa.kernels, listener.sa.bad  # derived before the edit
        involved = _edit(data.draw, gm.graph, Editor(listener))
        fresh = StreamAssignment(gm.graph)
        assert listener.kept is not involved
        if listener.kept:
            assert listener.sa == fresh and listener.sa.bad == fresh.bad
            assert listener.sa.streams == fresh.streams
            assert listener.sa.kernels == fresh.kernels  # nothing derived is left stale


def test_a_node_nobody_told_of_makes_it_drop_at_the_next_change():
    gm, _ = scheduled("moe")
    listener = _Absorbs(StreamAssignment(gm.graph))
    output = gm.graph.output_node()
    with gm.graph.inserting_before(output):  # a raw edit: the editor never hears of it
        gm.graph.call_function(OPS.set_stream.default, (1,))
    dead = next(n for n in gm.graph.nodes if n.target is OPS.record_stream.default)
    Editor(listener).erase(dead, "t")
    assert not listener.kept


# ----- in a pipeline -------------------------------------------------------------------------
def _ask(gm):
    stream_assignment(gm)
    return False


def test_computed_once_and_served_to_the_next_pass():
    gm, _ = scheduled("moe")
    result = fp.Pipeline([_ask, _ask], verify_analyses=True).run(gm)
    assert result.report.analysis_counts() == {"_ask": {"stream_assignment": [1, 1]}}


def _erase_a_dead_kernel(gm):
    """Erase the relu nobody reads through the editor (stream_assignment takes it in)."""
    before = stream_assignment(gm)
    dead = next(n for n in gm.graph.nodes if n.target is aten.relu.default and not n.users)
    fp.current_context().editor.erase(dead, "erase_a_dead_kernel")
    assert stream_assignment(gm) is before and dead not in before
    return True


_erase_a_dead_kernel.preserves = (stream_assignment,)


def _with_dead_relu_on_stream_1():
    gm, _ = scheduled("moe")
    side = next(n for n in gm.graph.nodes if n.meta.get("stream") == 1 and is_kernel(n))
    with gm.graph.inserting_after(side):
        gm.graph.call_function(aten.relu.default, (side,))
    return gm


def test_an_erasure_through_the_editor_is_taken_in():
    gm = _with_dead_relu_on_stream_1()
    passes = [_ask, _erase_a_dead_kernel, _ask]
    result = fp.Pipeline(passes, verify_analyses=True).run(gm)
    assert result.report.analysis_counts() == {
        "_ask": {"stream_assignment": [1, 1]},
        "_erase_a_dead_kernel": {"stream_assignment": [0, 2]},
    }


def _side_stream_at_the_end(gm):
    before = stream_assignment(gm)
    output = gm.graph.output_node()
    x = next(n for n in gm.graph.nodes if n.op == "placeholder")
    fp.current_context().editor.insert(
        OPS.set_stream.default, (1,), rule="side", origin=[x], before=output, val=None
    )
    after = stream_assignment(gm)
    assert after is not before and after[output] == 1 and before[output] == 0
    return True


def test_inserting_a_set_stream_drops_it():
    gm, _ = scheduled("moe")
    result = fp.Pipeline([_side_stream_at_the_end]).run(gm)
    assert result.report.analysis_counts() == {
        "_side_stream_at_the_end": {"stream_assignment": [2, 0]}
    }


def test_a_pass_that_claims_it_wrongly_is_named():
    def claims_streams(gm):
        """Switches to stream 1 before the output, and says the streams are as they were."""
        x = next(n for n in gm.graph.nodes if n.op == "placeholder")
        output = gm.graph.output_node()
        editor = fp.current_context().editor
        editor.insert(OPS.set_stream.default, (1,), rule="side", origin=[x], before=output)
        return True

    claims_streams.preserves = (stream_assignment,)
    gm, _ = scheduled("moe")
    with pytest.raises(fp.core.CheckFailedError) as e:
        fp.Pipeline([_ask, claims_streams], verify_analyses=True).run(gm)
    message = str(e.value)
    assert "pass 'claims_streams' declares it preserves analysis 'stream_assignment'" in message
    assert "check 'preserved analyses' failed after pass 'claims_streams'" in message
