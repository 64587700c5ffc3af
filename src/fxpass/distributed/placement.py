"""How a tensor is laid out across ranks: replicated, sharded along one dim, or partial sums.

A :class:`Shard` describes the local piece each rank holds of a global tensor::

    Shard(dim=2)                       dim 2 is cut into world-size contiguous chunks
    Shard(dim=0, outer=4)              dim 0 is [4, rest]: each of the 4 blocks is cut
    Shard(dim=2, parts=(64, 32, 32))   dim 2 is the concatenation of three parts (a fused
                                       q/k/v projection): each part is cut separately and
                                       a rank holds its chunk of every part, in order
    Shard(dim=1, ways=2)               cut into 2 chunks, not world-size ones (an expert's
                                       features, cut over the tensor-parallel ranks of its
                                       expert group); 0 means the flow's world size

Replicated values have no layout (``None``); :data:`PARTIAL` marks the output of a
row-parallel matmul, whose full value is the sum over ranks. The functions here are the
arithmetic: where a shard goes through a reshape, which slice of a weight a rank holds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = ["PARTIAL", "NotShardable", "Shard", "local_slice", "map_view"]


class NotShardable(Exception):
    """A value's layout cannot go through an op; ``str()`` says which and why."""


@dataclass(frozen=True)
class Shard:
    """A tensor cut along ``dim`` (see the module docstring for ``outer`` and ``parts``)."""

    dim: int
    outer: int = 1
    parts: tuple[int, ...] = ()
    ways: int = 0

    def moved(self, dim: int) -> Shard:
        return Shard(dim, self.outer, self.parts, self.ways)

    def describe(self) -> str:
        extra = f", parts {list(self.parts)}" if self.parts else ""
        extra += f", in {self.outer} blocks" if self.outer != 1 else ""
        extra += f", {self.ways} ways" if self.ways else ""
        return f"dim {self.dim}{extra}"


class _Partial:
    def __repr__(self) -> str:
        return "PARTIAL"


#: The layout of a row-parallel matmul's output: each rank holds a partial sum.
PARTIAL = _Partial()


def _suffix(shape: Sequence[int], i: int) -> int:
    return math.prod(shape[i + 1 :])


def map_view(before: Sequence[int], after: Sequence[int], shard: Shard) -> tuple[Shard, int, int]:
    """Where ``shard`` of a tensor of shape ``before`` lands after a row-major reshape to
    ``after``: ``(new_shard, units, dim)`` where ``units`` is how many slices of the new
    ``dim`` the sharded block spans (the world size must divide it: heads, features).

    ``[1, 8, 64]`` sharded on dim 2 viewed as ``[1, 8, 4, 16]`` is sharded on dim 2 (4
    units: heads); merged back to ``[1, 8, 64]`` it is sharded on dim 2 again. A view that
    splits the sharded block across two dims, or mixes it with another dim, raises
    :class:`NotShardable`.
    """
    d = shard.dim
    size = before[d]
    if shard.parts:
        same = len(after) - (len(before) - d - 1) - 1
        if (
            0 <= same < len(after)
            and after[same] == size
            and _suffix(after, same) == _suffix(before, d)
        ):
            return shard.moved(same), math.gcd(*shard.parts), same
        raise NotShardable(
            f"the fused projection's {size} features are reshaped to {list(after)} before "
            "being split into their parts"
        )
    block = size // shard.outer * _suffix(before, d)
    for e, n in enumerate(after):
        suffix = _suffix(after, e)
        if block % suffix or block == suffix:
            continue
        units = block // suffix
        if n % units == 0:
            return Shard(e, n // units, ways=shard.ways), units, e
    raise NotShardable(
        f"reshaping {list(before)} to {list(after)} mixes the sharded dim {d} with other dims"
    )


def local_slice(t: torch.Tensor, shard: Shard, rank: int, world_size: int) -> torch.Tensor:
    """The piece of the global tensor ``t`` that ``rank`` holds under ``shard`` when it is
    cut ``world_size`` ways (``shard.ways`` must be 0 or that): a new, contiguous tensor
    (never a view of ``t``, so the full tensor can be freed)."""
    d = shard.dim
    size = t.shape[d]
    pieces = []
    for block in t.chunk(shard.outer, dim=d) if shard.outer > 1 else (t,):
        parts = shard.parts or (size // shard.outer,)
        start = 0
        for p in parts:
            chunk = p // world_size
            pieces.append(block.narrow(d, start + rank * chunk, chunk))
            start += p
    return torch.cat(pieces, dim=d).contiguous() if len(pieces) > 1 else pieces[0].clone()
