"""Communication accounting: each rank's collectives and bytes per layer against the
strategy's minimum — Megatron's two all-reduces per layer, sequence parallelism's
reduce-scatter + all-gather of the same bytes, the experts' combine — with every extra
collective named with why (the embedding, the logits, distributed norms, a shared expert
reduced apart)."""

from __future__ import annotations

import pytest
import torch
from _shard_helpers import sharded

import fxpass as fp
from fxpass.distributed.accounting import OUTSIDE, communication

from _models import exported

_hf = pytest.importorskip("_hf")

HIDDEN = 8 * 64 * 4  # tokens x hidden x fp32: one exchange of the residual stream


def _layers(comm, rank=0):
    return [r for r in comm.ranks[rank] if r.layer != OUTSIDE]


def _outside(comm, rank=0):
    return next(r for r in comm.ranks[rank] if r.layer == OUTSIDE)


def _check_invariant(comm) -> None:
    """A layer with nothing extra has exactly the minimum, in count and bytes."""
    for rows in comm.ranks:
        for r in rows:
            if r.layer != OUTSIDE and not r.extra:
                assert sum(r.counts.values()) == r.minimum_count, r
                assert r.bytes == r.minimum_bytes, r


def test_tensor_parallel_is_megatrons_two_all_reduces_per_layer():
    comm = communication(sharded(2))
    assert comm.hidden_bytes == HIDDEN and len(comm.groups()) == 1
    for r in _layers(comm):
        assert (r.counts, r.bytes, r.minimum_bytes, r.extra) == ({"all_reduce": 2}, 2 * HIDDEN,
                                                                 2 * HIDDEN, [])  # fmt: skip
    out = _outside(comm)
    assert out.counts == {"all_reduce": 1, "all_gather": 1}
    assert "vocab-parallel embedding" in out.extra[0] and "logits" in out.extra[1]
    assert "every layer of every rank is at the minimum" in str(comm)
    _check_invariant(comm)


def test_sequence_parallel_is_reduce_scatter_and_all_gather_of_the_same_bytes():
    tp, sp = communication(sharded(2)), communication(sharded(2, sequence_parallel=True))
    for a, b in zip(_layers(tp), _layers(sp), strict=True):
        assert b.counts == {"all_gather": 2, "reduce_scatter": 2} and not b.extra
        assert b.bytes == 2 * a.bytes == b.minimum_bytes  # each all-reduce: RS + AG
    _check_invariant(sp)


def test_four_ranks_and_stages():
    comm = communication(sharded(4))
    assert all(not r.extra for r in _layers(comm, 3))
    staged = fp.shard(exported(dtype=torch.float32), tp=2, pp=2).communication()
    assert staged.groups() == [[0, 1], [2, 3]]
    assert [r.layer for r in staged.ranks[0]] == ["layers.0", OUTSIDE]
    assert [r.layer for r in staged.ranks[2]] == ["layers.1", OUTSIDE]
    _check_invariant(staged)


def test_experts_combine_at_the_minimum_and_a_shared_expert_is_named():
    mixtral = communication(fp.shard(_hf.exported("mixtral"), 2))
    assert "expert parallel" in mixtral.strategy
    assert all(r.counts == {"all_reduce": 2} and not r.extra for r in _layers(mixtral))
    moe = communication(fp.shard(exported(dtype=torch.float32, moe_experts=4), 2))
    for r in _layers(moe):  # attention, experts, and the shared expert's own all-reduce
        assert r.counts == {"all_reduce": 3}
        assert r.extra == [
            "1 more all-reduce of partial sums than two blocks need (partial sums reduced "
            "apart, then added: one all-reduce of their sum would do)"
        ]
    _check_invariant(mixtral)


def test_distributed_norms_are_named():
    comm = communication(fp.shard(_hf.exported("olmo3"), 2))
    for r in _layers(comm):  # q and k norms over the whole sharded projection
        assert r.counts == {"all_reduce": 4} and r.bytes == 2 * HIDDEN + 2 * 8 * 4
        assert len(r.extra) == 2 and all("distributed norm" in e for e in r.extra)
    assert "2 layers above the minimum" in str(comm)


#: the families above the minimum, and the extra each layer names
ABOVE = {"olmo3": "a distributed norm", "olmoe": "a distributed norm",
         "llama4": "1 more all-reduce of partial sums", "qwen2_moe": "1 more all-reduce"}  # fmt: skip


@pytest.mark.parametrize("family", _hf.SHARDED)
def test_every_family_at_the_minimum_or_says_why(family):
    comm = communication(fp.shard(_hf.exported(family), 2))
    _check_invariant(comm)
    for r in _layers(comm):
        if family in ABOVE:
            assert r.extra and all(ABOVE[family] in e for e in r.extra), r
        else:
            assert r.at_minimum, r
    data = comm.to_dict()
    assert data["hidden_bytes"] == comm.hidden_bytes and len(data["ranks"]) == 2


def test_async_tp_chunks_are_launches_not_bytes():
    comm = communication(sharded(2, sequence_parallel=True, async_tp=2))
    for r in _layers(comm):
        assert r.counts == {"all_gather": 4, "reduce_scatter": 4} and r.bytes == r.minimum_bytes
        assert r.extra == ["4 more launches: async TP's chunks (the same bytes, overlapped "
                           "with the matmuls)"]  # fmt: skip
