"""fxpass::all_reduce_add_rmsnorm: its fake kernel agrees with the real one on shape, dtype
and strides for every input layout (opcheck and a property test), on a world of one."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st

import fxpass  # noqa: F401  (registers torch.ops.fxpass)
from fxpass.ops import reference

OP = torch.ops.fxpass.all_reduce_add_rmsnorm.default


@pytest.fixture(scope="module")
def group():
    """A gloo group of one process (an all-reduce is the identity): its name."""
    if dist.is_initialized():
        yield dist.group.WORLD.group_name
        return
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield dist.group.WORLD.group_name
    finally:
        dist.destroy_process_group()


def _layout(t: torch.Tensor, kind: str) -> torch.Tensor:
    if kind == "transposed":
        return t.transpose(0, 1).contiguous().transpose(0, 1)
    if kind == "sliced":
        return torch.cat([t, t], dim=-1)[..., : t.shape[-1]]
    if kind == "expanded":
        return t[:1].expand(t.shape)
    return t


def test_numerics_follow_the_reference(group):
    g = torch.Generator().manual_seed(0)
    x, r = torch.randn(2, 8, 64, generator=g), torch.randn(2, 8, 64, generator=g)
    w = torch.randn(64, generator=g)
    normed, total = OP(x, r, w, 1e-6, 1.0, group)
    expected, expected_total = reference.fused_add_rmsnorm(x, r, w, 1e-6, 1.0)
    torch.testing.assert_close(normed, expected)
    assert torch.equal(total, expected_total)


@pytest.mark.parametrize("kind", ["contiguous", "transposed", "sliced", "expanded"])
def test_opcheck(group, kind):
    g = torch.Generator().manual_seed(1)
    x = _layout(torch.randn(4, 6, 16, generator=g), kind)
    r = _layout(torch.randn(4, 6, 16, generator=g), kind)
    w = torch.randn(16, generator=g)
    torch.library.opcheck(OP, (x, r, w, 1e-5, 0.0, group))


@settings(max_examples=25, deadline=None)
@given(
    shape=st.lists(st.integers(1, 5), min_size=2, max_size=3),
    kinds=st.tuples(*[st.sampled_from(["contiguous", "transposed", "sliced", "expanded"])] * 2),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
)
def test_fake_and_real_agree_on_every_layout(group, shape, kinds, dtype):
    from torch._subclasses.fake_tensor import FakeTensorMode

    x = _layout(torch.randn(shape).to(dtype), kinds[0])
    r = _layout(torch.randn(shape).to(dtype), kinds[1])
    w = torch.randn(shape[-1]).to(dtype)
    real = OP(x, r, w, 1e-6, 0.0, group)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = OP(*(mode.from_tensor(t) for t in (x, r, w)), 1e-6, 0.0, group)
    for a, b in zip(real, fake):
        assert (a.shape, a.dtype, a.stride()) == (b.shape, b.dtype, b.stride())


def test_bad_arguments(group):
    x = torch.randn(2, 8)
    with pytest.raises(RuntimeError, match="residual must have x's shape"):
        OP(x, torch.randn(8), torch.ones(8), 1e-6, 0.0, group)
    with pytest.raises(RuntimeError, match="group_name must name a process group"):
        OP(x, x, torch.ones(8), 1e-6, 0.0, "")
