"""Plans are data: JSON round trips (and the first format still reads), and every field of a
plan file is checked — a bad one is one line naming the field and the value."""

from __future__ import annotations

import json

import pytest
import torch

from fxpass.distributed import Decision, Mesh, PlanError, ShardPlan, analyze
from fxpass.distributed.plan import plural

from _models import exported


@pytest.fixture(scope="module")
def plan() -> ShardPlan:
    return analyze(exported(dtype=torch.float32, layers=1), 2)


def test_json_round_trip(plan, tmp_path):
    path = plan.save(tmp_path / "plan.json")
    again = ShardPlan.load(path)
    assert again == plan
    data = json.loads(path.read_text())
    assert data["format"] == "fxpass.shard_plan/2" and data["mesh"] == {"tp": 2, "ep": 1, "pp": 1}
    assert data["world_size"] == 2 and data["options"] == {
        "sequence_parallel": False,
        "fuse": False,
        "bucket": 0,
        "async_tp": 0,
    }
    assert data["gates"] == {} and data["applied"] == []
    first = data["decisions"][0]
    assert set(first) == {
        "param",
        "style",
        "node",
        "dim",
        "parts",
        "bias",
        "reason",
        "ways",
        "bytes",
    }


def test_the_first_format_still_reads(plan):
    data = plan.to_dict()
    old = {"format": "fxpass.shard_plan/1", "world_size": 2, "decisions": data["decisions"]}
    assert ShardPlan.from_dict(old).mesh == Mesh(tp=2)


def test_a_plan_is_edited_as_data(plan):
    data = plan.to_dict()
    for d in data["decisions"]:
        if ".mlp." in d["param"]:
            d.update(style="replicate", dim=None)
    edited = ShardPlan.from_dict(data)
    assert edited["layers.0.mlp.up_proj.weight"].style == "replicate"
    assert len(edited.sharded) == len(plan.sharded) - 3


_HEAD = '{"format": "fxpass.shard_plan/2", "mesh": {"tp": 2}, '


@pytest.mark.parametrize(
    "text, message",
    [
        ("{", "not valid JSON"),
        ('{"format": "something else"}', "not a sharding plan"),
        (_HEAD[:-2] + "}", "plan field 'plan.decisions' is missing"),
        (_HEAD + '"decisions": {}}', "plan field 'plan.decisions' must be a list, not {}"),
        (_HEAD + '"decisions": [3]}', "plan field 'decisions[0]' must be an object, not 3"),
        (_HEAD + '"decisions": [{"param": "w", "style": "row"}]}',
         "plan field 'decisions[0].node' is missing"),
        (_HEAD + '"decisions": [{"param": "w", "style": "diagonal", "node": "mm"}]}',
         "style must be one of batch, column, replicate, row, slice, vocab, not 'diagonal'"),
        (_HEAD + '"decisions": [{"param": "w", "style": "row", "node": "mm", "dim": -1}]}',
         "plan field 'decisions[0].dim' must be >= 0, not -1"),
        (_HEAD + '"decisions": [{"param": "w", "style": "row", "node": "mm", "dim": "1"}]}',
         "plan field 'decisions[0].dim' must be an integer or null, not '1'"),
        (_HEAD + '"decisions": [{"param": "w", "style": "column", "node": "mm", "parts": [2, "a"]}]}',
         "plan field 'decisions[0].parts[1]' must be a positive integer, not 'a'"),
        (_HEAD + '"decisions": [{"param": "w", "style": "vocab", "node": "e", "dim": 1}]}',
         "a vocab weight is cut along dim 0"),
        (_HEAD + '"decisions": [{"param": "w", "style": "row", "node": "mm", "why": 1}]}',
         "plan field 'decisions[0]' has an unknown key 'why'"),
        ('{"format": "fxpass.shard_plan/2", "mesh": {"tp": 0}, "decisions": []}',
         "plan field 'mesh.tp' must be >= 1, not 0"),
        ('{"format": "fxpass.shard_plan/2", "mesh": {"dp": 2}, "decisions": []}',
         "plan field 'mesh' has an unknown key 'dp'"),
        (_HEAD + '"world_size": 4, "decisions": []}',
         "plan field 'world_size' is 4, but the mesh tp 2 has 2"),
        (_HEAD + '"options": {"fuse": "yes"}, "decisions": []}',
         "plan field 'options.fuse' must be true or false, not 'yes'"),
        (_HEAD + '"decisions": [], "experts": [{"router": "topk", "experts": 1, "weights": []}]}',
         "plan field 'experts[0].experts' must be at least 2, not 1"),
        ('{"format": "fxpass.shard_plan/2", "mesh": {"pp": 2}, "decisions": [], '
         '"stages": [{"first": "a", "last": "b"}]}', "the plan has 1 stage but its mesh pp is 2"),
    ],
)  # fmt: skip
def test_bad_plans_say_what_is_wrong(text, message):
    with pytest.raises(PlanError) as e:
        ShardPlan.from_json(text)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_missing_plan_file(tmp_path):
    with pytest.raises(PlanError, match="cannot read the sharding plan"):
        ShardPlan.load(tmp_path / "nope.json")


def test_decision_defaults_its_dim():
    assert Decision("w", "column", "mm").dim == 0 and Decision("w", "replicate", "mm").dim is None
    with pytest.raises(PlanError, match="a replicated weight has no dim"):
        Decision("w", "replicate", "mm", dim=0)


def test_plurals_and_collective_counts(plan):
    assert (plural(1, "rank"), plural(2, "rank")) == ("1 rank", "2 ranks")
    assert plan.collective_counts() == {"all_reduce": 3, "all_gather": 1}
    assert "sharding plan, mesh tp 2" in str(plan)
