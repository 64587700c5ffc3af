"""The one executor of a rank's edits: it applies a script through the editor, cuts the
weights where the graph keeps them, recomputes the values once; a script that names what
the graph lacks fails before any edit, and a failed application leaves the graph and the
weights as they were; the debug counter counts each collective edit as one change."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

from fxpass.distributed.collectives import C10D
from fxpass.distributed.edit_script import EditScript, apply_edits
from fxpass.distributed.edits import Reduce, SetArg, SliceWeight, TakePiece
from fxpass.distributed.placement import Shard
from fxpass.distributed.plan import PlanError
from fxpass.edit.editor import Editor

aten = torch.ops.aten


def _mlp() -> fx.GraphModule:
    """``linear(relu(linear(x, w1)), w2)`` with ``get_attr`` weights and fake values."""
    torch.manual_seed(0)
    root = torch.nn.Module()
    root.w1 = torch.nn.Parameter(torch.randn(32, 16))
    root.w2 = torch.nn.Parameter(torch.randn(16, 32))
    g = fx.Graph()
    x = g.placeholder("x")
    w1, w2 = g.get_attr("w1"), g.get_attr("w2")
    h = g.create_node("call_function", aten.linear.default, (x, w1), name="linear")
    r = g.create_node("call_function", aten.relu.default, (h,), name="relu")
    g.output(g.create_node("call_function", aten.linear.default, (r, w2), name="linear_1"))
    gm = fx.GraphModule(root, g)
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    FakeTensorProp(gm, mode).propagate(mode.from_tensor(torch.randn(4, 16)))
    return gm


def _ctx(editor: Editor | None = None) -> SimpleNamespace:
    return SimpleNamespace(editor=editor or Editor(None), program=None)


def _state(gm: fx.GraphModule) -> tuple:
    nodes = list(gm.graph.nodes)
    return (
        nodes,
        [(n.name, n.target, n.args, dict(n.kwargs)) for n in nodes],
        [n.meta.get("val").shape for n in nodes if n.op != "output"],
        gm.w1,
        gm.w2,
        gm.code,
    )


def _cut_mlp(rank: int) -> EditScript:
    return EditScript(
        [Reduce("linear_1", "0")],
        [SliceWeight("w1", Shard(0), rank, 2), SliceWeight("w2", Shard(1), rank, 2)],
    )


def test_a_script_is_applied_through_the_editor_and_the_weights_cut():
    gm = _mlp()
    w1, w2 = gm.w1.detach().clone(), gm.w2.detach().clone()
    before, after = apply_edits(gm, _cut_mlp(1), _ctx(), "tensor_parallel")
    assert torch.equal(gm.w1, w1[16:]) and torch.equal(gm.w2, w2[:, 16:])
    assert isinstance(gm.w1, torch.nn.Parameter)
    assert (before, after) == (2 * 32 * 16 * 4, 32 * 16 * 4)
    nodes = {n.name: n for n in gm.graph.nodes}
    assert nodes["linear"].meta["val"].shape == (4, 16)  # values recomputed on the pieces
    (out,) = gm.graph.output_node().args
    assert out.target is C10D.wait_tensor.default
    assert out.args[0].target is C10D.all_reduce.default
    assert out.args[0].args == (nodes["linear_1"], "sum", "0")
    prov = out.meta["fxpass_provenance"]
    assert prov["rule"] == "tensor_parallel" and prov["replaced"] == ["linear_1"]


def test_a_script_naming_a_node_the_graph_lacks_fails_before_any_edit():
    gm = _mlp()
    state = _state(gm)
    script = EditScript([Reduce("linear_1", "0"), TakePiece("relu", "nope", 0, 0, 2)])
    with pytest.raises(PlanError, match="name node 'nope', which the graph does not have"):
        apply_edits(gm, script, _ctx(), "tensor_parallel")
    assert _state(gm) == state


def test_a_failed_application_leaves_the_graph_and_the_weights_as_they_were():
    gm = _mlp()
    state = _state(gm)
    # the collective goes in, then w1 cut along its inputs no longer fits x: the values
    # computed again at the end fail
    script = EditScript([Reduce("linear_1", "0")], [SliceWeight("w1", Shard(1), 0, 2)])
    with pytest.raises(Exception, match="same reduction dim"):
        apply_edits(gm, script, _ctx(), "tensor_parallel")
    assert _state(gm) == state
    assert not any(n.target is C10D.all_reduce.default for n in gm.graph.nodes)
    gm.graph.lint()


def test_a_failed_edit_midway_leaves_the_graph_as_it_was():
    gm = _mlp()
    state = _state(gm)
    script = EditScript([Reduce("linear_1", "0"), SetArg("relu", ("args", 3), 1)])
    with pytest.raises(IndexError):
        apply_edits(gm, script, _ctx(), "tensor_parallel")
    assert _state(gm) == state


class _Refuse:
    """A run whose debug counter allows no change."""

    pass_path: list[str] = ["tensor_parallel"]
    journal = None

    def __init__(self) -> None:
        self.events: list = []

    def allow(self) -> bool:
        return False

    def notify(self, event) -> None:
        self.events.append(event)


def test_the_debug_counter_counts_each_collective_edit_as_one_change():
    gm = _mlp()
    run = _Refuse()
    nodes = {n.name: n for n in gm.graph.nodes}
    script = EditScript([SetArg("relu", ("args", 0), nodes["linear"]), Reduce("linear_1", "0")])
    apply_edits(gm, script, _ctx(Editor(run)), "tensor_parallel")
    assert not any(n.target is C10D.all_reduce.default for n in gm.graph.nodes)  # refused
    assert [e.kind for e in run.events] == ["modify"]
