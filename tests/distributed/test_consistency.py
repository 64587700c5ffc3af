"""The rank consistency check: every real plan passes (dense, experts, sequence parallel,
fused, pipeline stages, 2 and 4 ranks; every family in test_sharded checks its own), and
each planted fault on one rank — a dropped, mis-shaped, reordered collective, another
reduce op, a collective on a branch only some ranks take — is one line naming the node on
each rank."""

from __future__ import annotations

import pytest
import torch
from _planted_collective import (
    collective_in_cond,
    drop_collective,
    misshape_collective,
    reduce_op,
    two_collectives,
)
from _shard_helpers import sharded

import fxpass as fp
from fxpass.distributed.consistency import check_ranks, trace

from _models import exported


@pytest.mark.parametrize(
    "world_size, options",
    [(2, {}), (4, {}), (2, {"sequence_parallel": True}), (2, {"fuse": True}),
     (4, {"sequence_parallel": True, "fuse": True})],
)  # fmt: skip
def test_real_plans_are_consistent(world_size, options):
    shards = sharded(world_size, **options)
    assert check_ranks(shards.programs, shards.mesh) == []
    calls, problems = trace(shards[0])
    assert calls and not problems
    assert shards.check() == []


@pytest.mark.parametrize("mesh", [{"tp": 2, "ep": 2}, {"tp": 2, "pp": 2}, {"ep": 2}])
def test_meshes_with_experts_and_stages_are_consistent(mesh):
    shards = fp.shard(exported(dtype=torch.float32, moe_experts=4), **mesh)
    assert check_ranks(shards.programs, shards.mesh) == []


def test_a_dropped_collective_names_the_node_on_each_rank():
    shards = sharded(2)
    planted, dropped = drop_collective(shards[1], 2)
    (fault,) = check_ranks([shards[0], planted], shards.mesh)
    msg = str(fault)
    assert f"rank 0 runs '{dropped}'" in msg and "rank 1 has none there (after '" in msg
    assert "rank 0 issues 6 on the group, rank 1 5" in msg and "\n" not in msg


def test_a_dropped_last_collective_is_caught():
    shards = sharded(2)
    n = sum(1 for c in trace(shards[0])[0] if c.kind == "all_reduce")
    planted, dropped = drop_collective(shards[0], n - 1)
    (fault,) = check_ranks([planted, shards[1]], shards.mesh)
    assert f"rank 1 runs '{dropped}'" in str(fault) and "rank 0 has none there" in str(fault)


def test_a_misshaped_collective_names_the_node_on_each_rank():
    shards = sharded(2)
    planted, node = misshape_collective(shards[1], 1)
    (fault,) = check_ranks([shards[0], planted], shards.mesh)
    msg = str(fault)
    assert f"rank 0 runs '{node}' (all_reduce sum f32[8, 64])" in msg
    assert f"rank 1 runs '{node}' (all_reduce sum f32[8, 32])" in msg
    assert msg.endswith("the shape differs") and msg.startswith("group '0', collective 2:")


def test_another_reduce_op_is_caught():
    shards = sharded(2)
    planted, node = reduce_op(shards[1], 0, "max")
    (fault,) = check_ranks([shards[0], planted], shards.mesh)
    assert "the reduce op differs" in str(fault) and f"'{node}' (all_reduce max" in str(fault)


def test_a_reordered_collective_is_caught():
    a, b = two_collectives("reduce first"), two_collectives("gather first")
    assert check_ranks([a, a]) == []
    (fault,) = check_ranks([a, b])
    msg = str(fault)
    assert "collective 1: rank 0 runs 'all_reduce' (all_reduce sum f32[4, 8])" in msg
    assert "rank 1 runs 'all_gather_into_tensor' (all_gather f32[2, 8] x2)" in msg
    assert msg.endswith("the kind differs; the same collectives in another order")


def test_faults_on_four_ranks_name_each_rank():
    shards = sharded(4)
    planted, _ = drop_collective(shards[3], 0)
    wrong, _ = misshape_collective(shards[2], 4)
    faults = check_ranks([shards[0], shards[1], wrong, planted], shards.mesh)
    assert [f.ranks for f in faults] == [(0, 2), (0, 3)]


def test_a_rank_missing_from_a_group_is_caught():
    shards = fp.shard(exported(dtype=torch.float32), tp=2, pp=2)
    programs = list(shards.programs)
    calls = [c for c in trace(programs[1])[0]]
    assert calls and calls[0].group != "0"  # the stage's own group
    planted = programs[1].graph_module
    for _ in range(len(calls)):
        planted, _ = drop_collective(planted, 0)
    programs[1] = planted
    (fault,) = check_ranks(programs, shards.mesh)
    assert f"group '{calls[0].group}'" in str(fault) and "rank 1 has none there" in str(fault)


def test_a_collective_on_one_branch_only_is_caught():
    assert check_ranks([collective_in_cond(True)] * 2) == []
    faults = check_ranks([collective_in_cond(False)] * 2)
    assert faults and all("issues different collectives in its branches" in str(f)
                          for f in faults)  # fmt: skip
