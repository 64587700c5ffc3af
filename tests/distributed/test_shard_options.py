"""The plan's options as data: each option's pass gated by a token range (run under the
program's compile range), what it did recorded in ``plan.applied`` with why, and the
gates and records serialised with the plan and checked field by field."""

from __future__ import annotations

import json

import pytest
import torch

import fxpass as fp
from fxpass.distributed import PlanError, ShardPlan
from fxpass.distributed.shard_options import OPTION_PASSES, tokens_of

from _models import exported


@pytest.fixture(scope="module")
def program():
    return exported(dtype=torch.float32)


def test_every_option_has_a_pass_in_order():
    assert [o.option for o in OPTION_PASSES] == ["sequence_parallel", "fuse", "bucket",
                                                 "async_tp"]  # fmt: skip
    assert set(o.option for o in OPTION_PASSES) == set(fp.distributed.plan.OPTIONS)


def test_the_fusion_runs_only_inside_its_range(program):
    assert tokens_of(program) == 8
    inside = fp.shard(program, 2, fuse=True, gates={"fuse": (1, 512)})
    outside = fp.shard(program, 2, fuse=True, gates={"fuse": (513, None)})
    assert inside.plan.applied[0]["applied"] and "fuse" in inside.reports[0].pass_names()[-1]
    assert inside.reports[0].stats()["fuse_allreduce_add_rmsnorm.rewrites"] == 4
    entry = outside.plan.applied[0]
    assert not entry["applied"] and entry["why"] == (
        "skipped: applies to tokens:513.., not to this compile's tokens:8..8"
    )
    assert outside.check() == [] and inside.check() == []


def test_sequence_parallel_gated_off_leaves_all_reduces(program):
    shards = fp.shard(program, 2, sequence_parallel=True, gates={"sequence_parallel": "64.."})
    assert fp.distributed.sharded.collective_counts(shards[0]) == {"all_reduce": 5,
                                                                   "all_gather": 1}  # fmt: skip


def test_gates_and_records_round_trip_and_are_checked(program, tmp_path):
    shards = fp.shard(program, 2, bucket=True, gates={"bucket": (1, 4096)})
    path = shards.plan.save(tmp_path / "plan.json")
    again = ShardPlan.load(path)
    assert again.gates == {"bucket": [1, 4096]} and again.applied == shards.plan.applied
    data = json.loads(path.read_text())
    for bad, message in (
        ({"bucket": [4, 2]}, "plan field 'gates.bucket' must be [lo, hi]"),
        ({"overlap": [1, 2]}, "plan field 'gates' has an unknown key 'overlap'"),
    ):
        with pytest.raises(PlanError, match=message.replace("[", r"\[").replace("]", r"\]")):
            ShardPlan.from_dict({**data, "gates": bad})
    with pytest.raises(PlanError, match="'options.bucket' must be >= 0"):
        ShardPlan.from_dict({**data, "options": {**data["options"], "bucket": -1}})
    with pytest.raises(PlanError, match="'options.async_tp' must be an integer"):
        ShardPlan.from_dict({**data, "options": {**data["options"], "async_tp": "two"}})


def test_a_plan_file_asks_for_the_passes(program):
    data = fp.shard(program, 2).plan.to_dict()
    data["options"].update(sequence_parallel=True, async_tp=2)
    shards = fp.shard(program, 2, plan=data)
    assert [a["applied"] for a in shards.plan.applied] == [True, True]
