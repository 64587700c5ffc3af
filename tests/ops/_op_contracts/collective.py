"""Contract entry of the collective fused with the norm (``fxpass/ops/collective.py``):
``all_reduce_add_rmsnorm`` on a one-process gloo group, where the all-reduce is the
identity, so its values must equal ``fused_add_rmsnorm``'s; both outputs are contiguous
whatever the layouts of x, the residual and the weight."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from hypothesis import strategies as st

from fxpass.ops import reference

from . import Call, Contract, in_layout, tensors

_WIDTHS = (1, 7, 16, 33)


def _group_name() -> str:
    """The default group's name: ``"0"`` for the group :func:`_one_rank` makes."""
    return dist.group.WORLD.group_name if dist.is_initialized() else "0"


@contextlib.contextmanager
def _one_rank() -> Iterator[None]:
    """A one-process gloo group for the call (the caller's group where one exists)."""
    if dist.is_initialized():
        yield
        return
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@st.composite
def _calls(draw: Any) -> Call:
    lead = draw(st.lists(st.integers(1, 4), min_size=0, max_size=3))
    shape = (*lead, draw(st.sampled_from(_WIDTHS)))
    x = draw(tensors(shape))
    r = draw(tensors(shape, dtypes=(x.dtype,)))
    w = draw(tensors(shape[-1:], dtypes=(x.dtype, torch.float32)))
    eps = draw(st.sampled_from((1e-6, 1e-5)))
    offset = draw(st.sampled_from((0.0, 1.0)))
    return Call((x, r, w, eps, offset, _group_name()))


def _examples() -> list[Call]:
    layouts = (("transposed", "sliced", "contiguous"), ("expanded", "contiguous", "sliced"))
    return [
        Call(
            (
                in_layout((3, 5, 16), torch.float32, xl, seed=i),
                in_layout((3, 5, 16), torch.float32, rl, seed=i + 1),
                in_layout((16,), torch.float32, wl, seed=9),
                1e-6,
                float(i),
                _group_name(),
            )
        )
        for i, (xl, rl, wl) in enumerate(layouts)
    ]


def _reference(call: Call) -> tuple[torch.Tensor, torch.Tensor]:
    normed, total = reference.fused_add_rmsnorm(*call.args[:5])
    return normed.contiguous(), total.contiguous()


CONTRACTS = {
    "fxpass::all_reduce_add_rmsnorm": Contract(
        calls=_calls(),
        examples=_examples,
        reference=_reference,
        context=_one_rank,
    ),
}
