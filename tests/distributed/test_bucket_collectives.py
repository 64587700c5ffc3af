"""``bucket_collectives``: adjacent small collectives of one group become one launch —
found from shapes and dependencies alone, within the threshold and cap, the ranks still
consistent; outputs on gloo ranks are checked in test_sharded (MoE, Olmo3, 2 and 4 ranks)."""

from __future__ import annotations

import pytest
import torch
from _planted_collective import two_collectives
from _shard_helpers import sharded

import fxpass as fp
from fxpass.distributed.bucket_collectives import bucket_collectives, find_buckets, launches
from fxpass.distributed.consistency import check_ranks, trace

from _models import exported

_hf = pytest.importorskip("_hf")


@pytest.fixture(scope="module")
def moe():
    return fp.shard(exported(dtype=torch.float32, moe_experts=4), 2)


def test_independent_neighbours_merge_into_one_launch(moe):
    result = fp.apply(moe[0], "bucket_collectives")
    stats = result.report.stats()
    assert stats["bucket_collectives.launches_before"] == 8
    assert stats["bucket_collectives.launches_after"] == 6 == launches(result.program.graph_module)
    assert stats["bucket_collectives.buckets"] == 2 and stats["bucket_collectives.merged"] == 4
    calls = trace(result.program)[0]
    merged = [c for c in calls if c.shape == (2 * 8 * 64,)]  # two [1, 8, 64] all-reduces
    assert len(merged) == 2 and all(c.kind == "all_reduce" for c in merged)
    other = fp.apply(moe[1], "bucket_collectives").program
    assert check_ranks([result.program, other], moe.mesh) == []
    assert moe[0].graph_module is not result.program.graph_module  # the input left alone


def test_a_chain_of_dependent_collectives_is_left_alone():
    shards = sharded(2)  # each all-reduce reads what the one before returned
    assert find_buckets(shards[0].graph_module, 1 << 30, 1 << 30) == []
    result = fp.apply(shards[0], "bucket_collectives")
    assert not result.report.modified


def test_threshold_and_cap(moe):
    gm = moe[0].graph_module
    assert len(find_buckets(gm, 64 * 1024, 1 << 20)) == 2
    assert find_buckets(gm, 1024, 1 << 20) == []  # each all-reduce is 2 KiB: not small
    assert find_buckets(gm, 64 * 1024, 3000) == []  # two would not fit in one bucket
    result = fp.apply(moe[0], "bucket_collectives{threshold=1024}")
    assert not result.report.modified


def test_other_kinds_break_adjacency():
    gm = two_collectives("reduce first")  # an all-reduce next to an all-gather
    assert find_buckets(gm, 1 << 20, 1 << 20) == []


def test_distributed_norms_bucket_per_layer():
    shards = fp.shard(_hf.exported("olmo3"), 2)
    result = fp.apply(shards[0], "bucket_collectives")
    stats = result.report.stats()
    assert (
        stats["bucket_collectives.launches_before"],
        stats["bucket_collectives.launches_after"],
    ) == (10, 8)


def test_the_plan_records_it_and_round_trips():
    shards = fp.shard(exported(dtype=torch.float32, moe_experts=4), 2, bucket=4096)
    (entry,) = shards.plan.applied
    assert entry["option"] == "bucket" and entry["value"] == 4096 and entry["applied"]
    assert "launches before 8" in entry["why"] and "launches after 6" in entry["why"]
    again = fp.distributed.ShardPlan.from_dict(shards.plan.to_dict())
    assert again.options["bucket"] == 4096 and again.applied == shards.plan.applied
    with pytest.raises(ValueError, match="threshold and cap are bytes"):
        bucket_collectives(shards[0].graph_module, threshold=-1)
