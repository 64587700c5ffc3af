"""Property: on random programs with views, copies and in-place writes, every cleanup and
canonicalization pass keeps the outputs (and the inputs' final values) exactly."""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.fx.experimental.proxy_tensor import make_fx

import fxpass as fp

_STEPS = ["add", "mul", "sin", "view", "clone", "add_", "mul_", "copy_", "detach", "dup"]
PIPELINE = "remove_detach,remove_noop,erase_copy,inplace_to_functional,cse,dce"


def _program(steps):
    def f(x, y):
        vals = [x * 1, y * 1]  # the graph's own copies: writes to them are internal
        for op, i, j in steps:
            a, b = vals[i % len(vals)], vals[j % len(vals)]
            if op == "add":
                vals.append(a + b)
            elif op == "mul":
                vals.append(a * b)
            elif op == "sin":
                vals.append(a.sin())
            elif op == "view":
                vals.append(a.view(2, 3).view(6))
            elif op == "clone":
                vals.append(a.clone())
            elif op == "add_":
                a.add_(b)
            elif op == "mul_":
                a.mul_(0.5)
            elif op == "copy_":
                a.copy_(b)
            elif op == "detach":
                vals.append(a.detach())
            else:  # the same expression twice: cse's business
                vals.append(a + b)
                vals.append(a + b)
        y.add_(vals[-1])  # an input written: must survive every pass
        return tuple(vals[-3:])

    return f


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(_STEPS), st.integers(0, 9), st.integers(0, 9)),
                min_size=1, max_size=12))  # fmt: skip
def test_cleanup_passes_keep_outputs_and_input_writes_exact(steps):
    x, y = torch.randn(6), torch.randn(6)
    gm = make_fx(_program(steps), tracing_mode="fake")(x, y)
    want_y = y.clone()
    want = gm(x.clone(), want_y)
    fp.Pipeline.parse(PIPELINE).run(gm)
    got_y = y.clone()
    got = gm(x.clone(), got_y)
    assert all(torch.equal(a, b) for a, b in zip(want, got))
    assert torch.equal(want_y, got_y)
