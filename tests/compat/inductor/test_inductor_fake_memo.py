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
RUNS = {"norm": 0, "pair": 0, "scale_": 0}


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
    assert RUNS == {"norm": 1, "pair": 1, "scale_": 0}
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
