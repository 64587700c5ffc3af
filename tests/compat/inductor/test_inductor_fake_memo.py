"""compat/inductor/_fake_memo.py: custom ops' fake kernels run once per fake mode and input
metadata while fwd_only traces; the traced graphs are the same as without the memo."""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from fxpass.compat.inductor import fwd_only

_lib = torch.library.Library("fxpass_memo_test", "DEF")
_lib.define("norm(Tensor x, float eps) -> Tensor")
_lib.define("pair(Tensor x) -> (Tensor, Tensor)")
_lib.define("scale_(Tensor(a!) x) -> ()")
_lib.define("wide(Tensor x) -> Tensor")
RUNS = {"norm": 0, "pair": 0, "scale_": 0, "wide": 0}


@torch.library.register_fake("fxpass_memo_test::norm", lib=_lib)
def _norm(x, eps):
    RUNS["norm"] += 1
    return (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


@torch.library.register_fake("fxpass_memo_test::pair", lib=_lib)
def _pair(x):
    RUNS["pair"] += 1
    return x.new_empty(x.shape), x.new_empty(x.shape[:-1])


@torch.library.register_fake("fxpass_memo_test::scale_", lib=_lib)
def _scale(x):
    RUNS["scale_"] += 1


@torch.library.register_fake("fxpass_memo_test::wide", lib=_lib)
def _wide(x):
    RUNS["wide"] += 1
    return x.new_empty((2 * x.shape[0], x.shape[1]))[: x.shape[0]]


ops = torch.ops.fxpass_memo_test


def search(x, w):
    a, b = ops.pair(x)
    return ops.norm(a, 1e-6) * w, b


def mutating(x):
    ops.scale_(x)
    return x + 1


def _trace(fn, *shapes, mode=None):
    mode = mode or FakeTensorMode()
    with mode:
        args = [torch.empty(s) for s in shapes]
        return fwd_only(fn, args)


def test_fake_kernels_run_once_per_mode_and_metadata_and_graphs_are_equal():
    RUNS.update(norm=0, pair=0)
    mode = FakeTensorMode()
    first = _trace(search, (4, 8), (8,), mode=mode)
    second = _trace(search, (4, 8), (8,), mode=mode)
    assert (RUNS["norm"], RUNS["pair"], RUNS["scale_"]) == (1, 1, 0)
    assert str(first.graph) == str(second.graph)
    vals = [n.meta["val"] for n in second.graph.nodes if n.op == "call_function"]
    ref = [n.meta["val"] for n in first.graph.nodes if n.op == "call_function"]
    for a, b in zip(vals, ref):
        a, b = (a, b) if isinstance(a, tuple) else ((a,), (b,))
        assert [(t.shape, t.stride(), t.dtype) for t in a] == [
            (t.shape, t.stride(), t.dtype) for t in b
        ]
        assert all(x is not y for x, y in zip(a, b))  # new fake tensors each time
    # other sizes: the kernels run again
    _trace(search, (2, 8), (8,), mode=mode)
    assert RUNS["norm"] == 2 and RUNS["pair"] == 2
    # another fake mode remembers nothing of this one
    _trace(search, (4, 8), (8,))
    assert RUNS["norm"] == 3


def test_mutating_ops_and_real_inputs_are_not_remembered():
    RUNS.update(norm=0, scale_=0)
    mode = FakeTensorMode()
    _trace(mutating, (4,), mode=mode)
    _trace(mutating, (4,), mode=mode)
    assert RUNS["scale_"] == 2
    # real inputs: ops run as before (fake kernels are not called at all)
    x = torch.randn(4, 8)
    torch.library.impl(_lib, "norm", "CPU")(lambda x, eps: x * 2)
    gm = fwd_only(lambda x: ops.norm(x, 1e-6), [x])
    assert RUNS["norm"] == 0
    assert torch.equal(gm(x), x * 2)


def _functional_scale(x):
    # a mutating op in its functional form, as vLLM's quant patterns write it
    out = torch.ops.higher_order.auto_functionalized(ops.scale_.default, x=x.clone())
    return out[1] + 1


def test_auto_functionalized_runs_once_per_mode_and_metadata():
    RUNS.update(scale_=0)
    mode = FakeTensorMode()
    first = _trace(_functional_scale, (4, 8), mode=mode)
    second = _trace(_functional_scale, (4, 8), mode=mode)
    assert RUNS["scale_"] == 1
    assert str(first.graph) == str(second.graph)
    af = [n for n in second.graph.nodes if n.target is torch.ops.higher_order.auto_functionalized]
    ref = [n for n in first.graph.nodes if n.target is torch.ops.higher_order.auto_functionalized]
    (a,), (b,) = af, ref
    assert a.meta["val"][0] is None and b.meta["val"][0] is None
    assert a.meta["val"][1].shape == b.meta["val"][1].shape == (4, 8)
    assert a.meta["val"][1].stride() == b.meta["val"][1].stride()
    assert a.meta["val"][1] is not b.meta["val"][1]
    # a differing input misses: other sizes, another dtype, another layout, another mode
    _trace(_functional_scale, (2, 8), mode=mode)
    assert RUNS["scale_"] == 2

    def half(x):
        return _functional_scale(x.half())

    _trace(half, (4, 8), mode=mode)
    assert RUNS["scale_"] == 3

    def transposed(x):
        y = torch.empty_strided((4, 8), (1, 4))
        y.copy_(x)
        out = torch.ops.higher_order.auto_functionalized(ops.scale_.default, x=y)
        return out[1] + 1

    gm = _trace(transposed, (4, 8), mode=mode)
    assert RUNS["scale_"] == 4
    (t,) = [n for n in gm.graph.nodes if n.target is torch.ops.higher_order.auto_functionalized]
    assert t.meta["val"][1].stride() == (1, 4)
    _trace(_functional_scale, (4, 8))
    assert RUNS["scale_"] == 5


def test_results_on_larger_storages_are_not_remembered():
    # a fake kernel returning a tensor at offset 0 of a larger storage: a remembered result
    # would be a fresh tensor on a storage of the exact size, so it is run every time
    RUNS.update(wide=0)
    mode = FakeTensorMode()
    for _ in range(2):
        gm = _trace(lambda x: ops.wide(x) + 1, (4, 8), mode=mode)
        (t,) = [n for n in gm.graph.nodes if n.target is ops.wide.default]
        assert t.meta["val"].untyped_storage().nbytes() == 8 * 8 * 4
    assert RUNS["wide"] == 2
