"""Metadata on every new node: fake values, source locations, torch's from_node, provenance."""

from __future__ import annotations

import operator

import torch

from fxpass.edit.provenance import COPIED_META
from fxpass.rewrite import GraphReplacement, P, Rule, rewrite

from _models import exported

aten = torch.ops.aten
x = P.var("x")


def _new(gm):
    return [n for n in gm.graph.nodes if "fxpass_provenance" in n.meta]


def test_every_new_node_has_value_location_and_provenance():
    ep = exported()
    rule = Rule(
        P(aten.rsqrt.default, x),
        lambda x: torch.ops.aten.div.Tensor(1.0, torch.ops.aten.sqrt.default(x)),
        name="rsqrt_to_div",
    )
    assert rewrite(ep.graph_module, [rule], pass_name="mypass").rewrites == 5
    made = _new(ep.graph_module)
    assert len(made) == 10
    for n in made:
        val = n.meta["val"]
        assert isinstance(val, torch.Tensor) and val.dtype == torch.float32
        assert tuple(val.shape) == (1, 8, 1)
        for key in ("stack_trace", "nn_module_stack"):
            assert key in n.meta and key in COPIED_META
        prov = n.meta["fxpass_provenance"]
        assert prov["rule"] == "rsqrt_to_div" and prov["pass"] == "mypass"
        assert prov["replaced"][0].startswith("rsqrt") and prov["location"].endswith(
            f"test_metadata.py:{test_every_new_node_has_value_location_and_provenance.__code__.co_firstlineno + 2}"
        )
        (src,) = n.meta["from_node"]
        assert src.name.startswith("rsqrt") and src.pass_name == "mypass"
        assert src.action[0].name == "REPLACE" and src.from_node  # export's own history kept
    ep.graph_module.recompile()
    ep.module()(torch.zeros(1, 8, dtype=torch.long))


def test_values_follow_shapes_not_a_stale_cache():
    def f(a, b):
        return torch.relu(a), torch.relu(b)

    args = (torch.randn(2, 3), torch.randn(5, 7))
    gm = torch.export.export(_Fn(f), args).run_decompositions().graph_module
    rewrite(gm, [Rule(P(aten.relu.default, x), lambda x: torch.ops.aten.clamp_min.default(x, 0.0))])
    shapes = sorted(tuple(n.meta["val"].shape) for n in _new(gm))
    assert shapes == [(2, 3), (5, 7)]


def test_outputs_and_their_values():
    ep = exported()
    s = P(aten.add.Tensor, P.node("a"), P.node("b")).named("s")
    rule = Rule(
        P(aten._to_copy.default, s, dtype=torch.float32),
        lambda a, b: (operator.add(a, b).float(), operator.add(a, b)),
        outputs=["s"],
    )
    gm = ep.graph_module
    sites = [
        n
        for n in gm.graph.nodes
        if n.target is aten._to_copy.default
        and n.kwargs == {"dtype": torch.float32}
        and getattr(n.args[0], "target", None) is aten.add.Tensor
    ]
    assert rewrite(gm, [rule], once=True).rewrites == len(sites) > 0
    made = _new(gm)
    assert made and all("val" in n.meta for n in made)
    casts = [n for n in made if n.op == "call_method"]
    assert {n.meta["val"].dtype for n in casts} == {torch.float32}


class _Fn(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def test_dynamo_graphs_get_example_values():
    graphs = []
    torch._dynamo.reset()
    torch.compile(
        lambda a: torch.relu(a) * 2,
        backend=lambda gm, ex: (graphs.append(gm), gm.forward)[1],
        fullgraph=True,
    )(torch.randn(3))
    torch._dynamo.reset()
    gm = graphs[0]
    rewrite(gm, [Rule(P(torch.relu, x), lambda x: torch.clamp(x, min=0))])
    (n,) = _new(gm)
    assert n.meta["example_value"].shape == (3,) and n.meta["val"] is n.meta["example_value"]


def _same_shape_relus():
    def f(a, b, c):
        return torch.relu(a), torch.relu(b), torch.relu(c)

    args = (torch.randn(2, 3), torch.randn(2, 3), torch.randn(2, 3).t())
    return torch.export.export(_Fn(f), args).run_decompositions().graph_module


def test_a_new_node_keeps_the_replaced_nodes_value_when_its_metadata_is_the_same():
    gm = _same_shape_relus()
    old = [n.meta["val"] for n in gm.graph.nodes if n.target is aten.relu.default]
    rewrite(gm, [Rule(P(aten.relu.default, x), lambda x: torch.ops.aten.clamp_min.default(x, 0.0))])
    new = [n.meta["val"] for n in _new(gm)]
    # every value has its site's layout (the third input is transposed); the second site
    # finds the result the first computed, and the old fake tensor stands in for a fresh one
    assert all(n.stride() == o.stride() and n.shape == o.shape for n, o in zip(new, old))
    assert new[1] is old[1]


def test_a_view_made_by_a_replacement_shares_its_inputs_storage_at_every_site():
    from fxpass.fxutil.views import shares_storage

    gm = _same_shape_relus()
    rule = Rule(
        P(aten.relu.default, x),
        lambda x: torch.ops.aten.t.default(torch.ops.aten.t.default(torch.ops.aten.relu(x))),
        name="relu_through_views",
    )
    rewrite(gm, [rule])
    views = [n for n in _new(gm) if n.target is aten.t.default]
    assert len(views) == 6
    for v in views:  # alias analysis reads storages: a view's value must share its base's
        assert shares_storage(v.meta["val"], v.args[0].meta["val"])


def test_new_values_follow_the_graphs_autograd_convention():
    """Export records values computed without autograd (a weight's users do not require
    grad), Dynamo with it; a new node's value follows the node it replaces."""
    gm = exported().graph_module
    params = [n for n in gm.graph.find_nodes(op="placeholder") if n.meta["val"].requires_grad]
    w = P.var("w", where=lambda n: n.meta["val"].requires_grad)  # a weight, read directly
    rule = Rule(P(aten.mul.Tensor, w, x), lambda w, x: torch.ops.aten.mul.Tensor(x, w))
    assert rewrite(gm, [rule], once=True).rewrites == 5
    made = _new(gm)
    assert made and all(n.args[1] in params for n in made)
    assert not any(n.meta["val"].requires_grad for n in made)

    graphs = [_dynamo_relu_of_linear()]
    rewrite(graphs[0], [Rule(P(torch.relu, x), lambda x: torch.clamp(x, min=0))])
    (n,) = _new(graphs[0])
    assert n.meta["example_value"].requires_grad  # relu of a Linear's output, as Dynamo has it


def _dynamo_relu_of_linear():
    """Dynamo's graph of relu(Linear(a)): values recorded with autograd (example_value)."""
    graphs = []
    torch._dynamo.reset()
    linear = torch.nn.Linear(3, 3)
    torch.compile(
        lambda a: torch.relu(linear(a)),
        backend=lambda gm, ex: (graphs.append(gm), gm.forward)[1],
        fullgraph=True,
    )(torch.randn(2, 3))
    torch._dynamo.reset()
    return graphs[0]


class _Knowing(GraphReplacement):
    """clamp_min(x, 0), declaring the value it knows for the node it writes."""

    def __init__(self, value_for):
        self.value_for = value_for
        self.known = {}

    def write(self, match, bindings, editor):
        x = bindings["x"].node
        new = editor.create(x.graph, "call_function", aten.clamp_min.default, (x, 0.0), {})
        self.known = {new: self.value_for(x)}
        return new

    def known_values(self):
        return self.known


def test_a_value_the_replacement_knows_is_taken_as_it_is():
    gm = _same_shape_relus()
    given = []

    def value_for(x):
        v = x.meta["val"]
        given.append(v.fake_mode.from_tensor(torch.empty_strided(v.shape, v.stride())))
        return given[-1]

    rewrite(gm, [Rule(P(aten.relu.default, x), _Knowing(value_for))])
    made = _new(gm)
    assert len(given) == len(made) == 3
    assert all(n.meta["val"] is g for n, g in zip(made, given))


def test_known_values_are_not_taken_where_values_are_computed_with_autograd():
    graphs = [_dynamo_relu_of_linear()]
    stale = []

    def value_for(x):  # a value without autograd: not what this graph records
        v = x.meta["example_value"]
        with torch.no_grad():
            stale.append(v.fake_mode.from_tensor(torch.empty(v.shape)))
        return stale[-1]

    rewrite(graphs[0], [Rule(P(torch.relu, x), _Knowing(value_for))])
    (n,) = _new(graphs[0])
    assert stale and n.meta["val"] is not stale[0] and n.meta["val"].requires_grad
