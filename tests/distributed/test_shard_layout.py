"""Shard layouts: where a shard lands after a reshape, and which piece a rank holds."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fxpass.distributed.placement import NotShardable, Shard, local_slice, map_view


@pytest.mark.parametrize(
    "before, after, shard, expected, units",
    [
        ([1, 8, 64], [1, 8, 4, 16], Shard(2), Shard(2), 4),  # features -> 4 heads of 16
        ([1, 8, 4, 16], [1, 8, 64], Shard(2), Shard(2), 64),  # heads merged back
        ([8, 64], [1, 8, 64], Shard(1), Shard(2), 64),  # core ATen's matmul output
        ([1, 4, 8, 16], [4, 8, 16], Shard(1), Shard(0), 4),  # heads as the bmm batch
        ([2, 4, 8, 16], [8, 8, 16], Shard(1), Shard(0, outer=2), 4),  # batch 2: in 2 blocks
        ([8, 8, 16], [2, 4, 8, 16], Shard(0, outer=2), Shard(1), 4),  # ...and back
        ([8, 256], [1, 8, 256], Shard(1, parts=(128, 128)), Shard(2, parts=(128, 128)), 128),
        ([4, 16], [64], Shard(1), Shard(0, outer=4), 16),  # an inner dim merged: 4 blocks
    ],
)
def test_map_view(before, after, shard, expected, units):
    new, n, dim = map_view(before, after, shard)
    assert (new, n, dim) == (expected, units, expected.dim)


@pytest.mark.parametrize(
    "before, after, shard",
    [
        ([3, 4], [2, 6], Shard(1)),  # each row's 4 sharded elements straddle rows of 6
        ([8, 192], [8, 3, 64], Shard(1, parts=(64, 64, 64))),  # fused parts reshaped
    ],
)
def test_views_that_mix_the_sharded_dim_are_refused(before, after, shard):
    with pytest.raises(NotShardable):
        map_view(before, after, shard)


@settings(max_examples=40, deadline=None)
@given(
    world=st.sampled_from([1, 2, 4]),
    parts=st.lists(st.integers(1, 3), min_size=1, max_size=3),
    outer=st.sampled_from([1, 2]),
    rows=st.integers(1, 3),
    dim=st.sampled_from([0, 1]),
)
def test_the_ranks_pieces_make_the_whole(world, parts, outer, rows, dim):
    parts = tuple(p * world for p in parts)
    if outer > 1:
        parts = parts[:1]
    size = sum(parts) * outer
    shape = [size, rows] if dim == 0 else [rows, size]
    t = torch.arange(size * rows).reshape(shape)
    shard = Shard(dim, outer=outer, parts=parts if len(parts) > 1 else ())
    pieces = [local_slice(t, shard, r, world) for r in range(world)]
    assert all(p.shape[dim] == size // world and p.is_contiguous() for p in pieces)
    # rank r holds, in every block and part, the r-th contiguous chunk
    blocks = t.chunk(outer, dim)
    for r, piece in enumerate(pieces):
        expected, local = [], piece.chunk(outer, dim)
        for b in blocks:
            start = 0
            for p in parts:
                expected.append(b.narrow(dim, start + r * (p // world), p // world))
                start += p
        assert torch.equal(torch.cat(local, dim), torch.cat(expected, dim))
    assert sum(p.numel() for p in pieces) == t.numel()
