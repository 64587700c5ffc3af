"""Fake results on symbolic sizes, remembered per fake mode: a hit gives exactly the metadata
a fresh computation gives, and what cannot be keyed or rebuilt is computed every time."""

from __future__ import annotations

import sys

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv

from fxpass.rewrite import P, Rule, rewrite
from fxpass.rewrite._symbolic_results import SymbolicResults

aten = torch.ops.aten
x = P.var("x")


def _symbolic(*shapes, **env):
    """Fake tensors of one mode whose sizes are all symbolic."""
    from torch.fx.experimental.symbolic_shapes import DimDynamic, StatelessSymbolicContext

    mode = FakeTensorMode(shape_env=ShapeEnv(**env))
    out = []
    for shape in shapes:
        ctx = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC] * len(shape))
        out.append(mode.from_tensor(torch.randn(*shape), symbolic_context=ctx))
    return mode, out


def _meta(v):
    """Everything a value's metadata says (symbolic sizes by their expressions)."""
    if isinstance(v, (tuple, list)):
        return tuple(_meta(t) for t in v)

    def e(s):
        return s.node.expr if isinstance(s, torch.SymInt) else s

    return (
        type(v).__name__,
        tuple(map(e, v.shape)),
        tuple(map(e, v.stride())),
        e(v.storage_offset()),
        v.dtype,
        v.device,
        v.requires_grad,
        v.is_contiguous(),
    )


def _fresh(mode, op, *args, **kwargs):
    with mode:
        return op(*args, **kwargs)


def test_a_hit_has_exactly_the_metadata_of_a_fresh_computation():
    mode, (a,) = _symbolic((4, 6))
    b = a.t()  # (a's guards, made by the first call, would change its key otherwise)
    cache = SymbolicResults()
    calls = []

    def compute():
        calls.append(1)
        return _fresh(mode, aten.mm.default, a, b)

    miss = cache.call(aten.mm.default, (a, b), {}, compute)
    hit = cache.call(aten.mm.default, (a, b), {}, compute)
    assert len(calls) == 1 and (cache.hits, cache.misses) == (1, 1)
    assert hit is not miss and hit.fake_mode is mode
    assert _meta(hit) == _meta(miss) == _meta(_fresh(mode, aten.mm.default, a, b))


def test_a_tuple_result_and_the_preferred_value():
    mode, (a,) = _symbolic((5, 8))
    cache = SymbolicResults()
    op = aten.var_mean.correction

    def compute():
        return _fresh(mode, op, a, [1], correction=0, keepdim=True)

    first = cache.call(op, (a, [1]), {"correction": 0, "keepdim": True}, compute)
    donor = _fresh(mode, op, a, [1], correction=0, keepdim=True)
    hit = cache.call(op, (a, [1]), {"correction": 0, "keepdim": True}, compute, prefer=donor)
    assert _meta(hit) == _meta(first) == _meta(donor)
    assert hit[0] is donor[0] and hit[1] is donor[1]  # the replaced node's values stand


def test_different_sizes_strides_or_literals_are_different_keys():
    mode, (a, b) = _symbolic((4, 6), (4, 6))
    cache = SymbolicResults()
    results = [
        cache.call(
            aten.sum.dim_IntList,
            (t, [d]),
            {},
            lambda t=t, d=d: _fresh(mode, aten.sum.dim_IntList, t, [d]),
        )
        for t, d in ((a, 0), (a, 1), (b, 0), (a.t(), 0))
    ]
    assert cache.hits == 0  # b's sizes are other symbols; a.t() has other strides
    assert [_meta(r)[1] for r in results] == [
        tuple(map(lambda s: s.node.expr, r.shape)) for r in results
    ]
    again = cache.call(aten.sum.dim_IntList, (a, [1]), {}, lambda: None)
    assert cache.hits == 1 and _meta(again) == _meta(results[1])


def test_static_sizes_views_writes_and_made_up_sizes_are_never_remembered():
    cache = SymbolicResults()
    mode, (a,) = _symbolic((4, 6))
    static_mode = FakeTensorMode()
    s = static_mode.from_tensor(torch.randn(4, 6))
    cases = [
        (aten.relu.default, (s,), static_mode),  # static: FakeResults' job
        (aten.t.default, (a,), mode),  # a view of its input
        (aten.relu_.default, (a,), mode),  # writes into its input
    ]
    for op, args, m in cases:
        for _ in range(2):
            cache.call(op, args, {}, lambda op=op, args=args, m=m: _fresh(m, op, *args))
    assert cache.hits == 0
    mode, (a,) = _symbolic((4, 6), allow_dynamic_output_shape_ops=True)
    for _ in range(2):  # nonzero's size is a new (unbacked) symbol each time
        out = cache.call(
            aten.nonzero.default, (a,), {}, lambda: _fresh(mode, aten.nonzero.default, a)
        )
    assert cache.hits == 0 and out is not None


def test_a_rewrite_on_a_dynamic_graph_hits_and_gives_the_values_of_a_cold_run(monkeypatch):
    """One replacement at several sites of an exported graph with a dynamic dimension: the
    values are those a cold computation gives."""

    class M(torch.nn.Module):
        def forward(self, a, b):
            return torch.relu(a) + torch.relu(b), torch.relu(a.t())

    dim = torch.export.Dim("n")
    args = (torch.randn(4, 6), torch.randn(4, 6))
    ep = torch.export.export(M(), args, dynamic_shapes=({0: dim}, {0: dim}))

    def run(cache):
        gm = ep.run_decompositions().graph_module
        # (fxpass.rewrite is also a function's name: the module itself)
        monkeypatch.setattr(sys.modules["fxpass.rewrite.metadata"], "SYMBOLIC_RESULTS", cache)
        rule = Rule(P(aten.relu.default, x), lambda x: aten.clamp_min.default(x, 0.0))
        assert rewrite(gm, [rule]).rewrites == 3
        return [_meta(n.meta["val"]) for n in gm.graph.nodes if n.target is aten.clamp_min.default]

    warm = SymbolicResults()
    cold = run(warm)  # fills it
    hits = warm.hits
    again = run(warm)
    assert warm.hits > hits
    assert again == cold == run(SymbolicResults())
    assert any(isinstance(s, torch.SymInt) for s in _new_val_sizes(ep))


def _new_val_sizes(ep):
    return [s for n in ep.graph.nodes if n.op == "placeholder" for s in n.meta["val"].shape]
