"""Compile ranges: a dynamic-shape model compiled once per range, the graphs differing
exactly by the range-limited pass, and each call served by the graph of its range."""

from __future__ import annotations

import pytest
import torch
from _target_models import convnet
from test_backend import relu_to_clamp

import fxpass as fp
from fxpass.core.pass_registry import applies_to
from fxpass.targets.dispatch import compile_ranges


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _ops(gm: torch.fx.GraphModule) -> list[str]:
    return [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]


@pytest.mark.parametrize("ir", ["dynamo", "aten"])
def test_two_ranges_differ_exactly_by_the_range_limited_pass(ir):
    """The same for Dynamo's graph and for the ATen graphs AOTAutograd hands a compiler."""
    model = convnet()
    graphs: list[torch.fx.GraphModule] = []

    def keep(gm, example_inputs):
        graphs.append(gm)
        return gm.forward if ir == "dynamo" else _boxed(gm)

    be = fp.backend(
        [applies_to(relu_to_clamp, batch=(1, 4)), "cse"],
        ir=ir,
        compiler=keep,
        ranges={"batch": [(1, 4), (5, None)]},
        dims={"batch": ("x", 0)},
    )
    compiled = torch.compile(model, backend=be, dynamic=True)
    with torch.no_grad():
        for batch in (2, 6):
            (x,) = model.example_inputs(batch=batch)
            torch.testing.assert_close(compiled(x), model(x))
    # one graph per range, covering every size: no fallback (the aten IR's first attempt
    # is restarted by Dynamo before any pass runs, as with a stock backend)
    small, large = graphs[-2:]
    assert [r.where["range"] for r in be.reports] == ["batch:1..4", "batch:5.."]
    assert be.reports[0].find("relu_to_clamp").stats == {"relu_rewritten": 2}
    skipped = be.reports[1].find("relu_to_clamp")
    assert skipped.status == "skipped" and "batch:5.." in skipped.notes[0]
    assert _ops(small) != _ops(large)
    fp.Pipeline([relu_to_clamp]).run(large)  # the one difference: the limited pass
    assert _ops(small) == _ops(large)


def test_calls_go_to_the_graph_of_their_range():
    model = convnet()
    be = fp.backend(
        [applies_to(relu_to_clamp, batch=(2, 4))],
        ir="dynamo",
        compiler="eager",
        ranges={"batch": [(2, 4), (5, 8)]},
    )  # no dims: the first symbolic size
    compiled = torch.compile(model, backend=be, dynamic=True)
    with torch.no_grad():
        for batch in (2, 4, 7, 12):
            (x,) = model.example_inputs(batch=batch)
            torch.testing.assert_close(compiled(x), model(x))
    (dispatch,) = be.dispatches
    calls = dispatch.calls
    assert calls.get("batch:2..4") == 2 and calls.get("batch:5..8") == 1
    assert calls.get("outside") == 1  # 12: compiled without the range-limited pass
    assert [r.where.get("range") for r in be.reports[:3]] == ["batch:2..4", "batch:5..8", None]


def test_a_static_size_compiles_once_for_exactly_its_value():
    model = convnet()
    (x,) = model.example_inputs(batch=3)
    be = fp.backend(
        [applies_to(relu_to_clamp, batch=(1, 4))],
        ir="dynamo",
        compiler="eager",
        ranges={"batch": [(1, 4), (5, None)]},
        dims={"batch": ("x", 0)},
    )
    with torch.no_grad():
        torch.compile(model, backend=be, dynamic=False)(x)
    (report,) = be.reports
    assert report.where["range"] == "batch:3" and report.find("relu_to_clamp").modified


@pytest.mark.parametrize(
    ("ranges", "dims", "message"),
    [
        ({"tokens": [(1, 8), (8, 16)]}, None, "overlap: 1..8 and 8..16"),
        ({"tokens": (1, 8)}, None, "is a list of"),
        ({}, None, "maps each symbolic size"),
        ({"tokens": [(1, 8)], "batch": [(1, 2)]}, None, "say where each is"),
        ({"tokens": [(1, 8)]}, {"batch": ("x", 0)}, "has no ranges"),
        ({"tokens": [(1, 8)]}, {"tokens": "x.0"}, "(argument name, dimension)"),
        ({"tokens": [(8, 1)]}, None, "ends at a whole number"),
    ],
)
def test_bad_ranges_are_refused(ranges, dims, message):
    with pytest.raises(ValueError, match=message):
        compile_ranges(ranges, dims)


def _boxed(gm):
    from torch._dynamo.backends.debugging import boxed_nop

    return boxed_nop(gm, [])
