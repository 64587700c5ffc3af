"""Plans are data: JSON round trips, bad JSON and bad decisions are one-line errors."""

from __future__ import annotations

import json

import pytest
import torch

from fxpass.distributed import Decision, PlanError, ShardPlan, analyze

from _models import exported


@pytest.fixture(scope="module")
def plan() -> ShardPlan:
    return analyze(exported(dtype=torch.float32, layers=1), 2)


def test_json_round_trip(plan, tmp_path):
    path = plan.save(tmp_path / "plan.json")
    again = ShardPlan.load(path)
    assert again == plan
    data = json.loads(path.read_text())
    assert data["format"] == "fxpass.shard_plan/1" and data["world_size"] == 2
    first = data["decisions"][0]
    assert set(first) == {"param", "style", "node", "dim", "parts", "bias", "reason"}


def test_a_plan_is_edited_as_data(plan):
    data = plan.to_dict()
    for d in data["decisions"]:
        if ".mlp." in d["param"]:
            d.update(style="replicate", dim=None)
    edited = ShardPlan.from_dict(data)
    assert edited["layers.0.mlp.up_proj.weight"].style == "replicate"
    assert len(edited.sharded) == len(plan.sharded) - 3


@pytest.mark.parametrize(
    "text, message",
    [
        ("{", "not valid JSON"),
        ('{"format": "something else"}', "not a sharding plan"),
        ('{"format": "fxpass.shard_plan/1", "world_size": 2}', "malformed sharding plan"),
        (
            '{"format": "fxpass.shard_plan/1", "world_size": 2, "decisions": '
            '[{"param": "w", "style": "diagonal", "node": "mm"}]}',
            "style must be one of",
        ),
        (
            '{"format": "fxpass.shard_plan/1", "world_size": 2, "decisions": '
            '[{"param": "w", "style": "row", "node": "mm", "dim": 0}]}',
            "a row weight is cut along dim 1, not 0",
        ),
    ],
)
def test_bad_plans_say_what_is_wrong(text, message):
    with pytest.raises(PlanError, match=message) as e:
        ShardPlan.from_json(text)
    assert "\n" not in str(e.value)


def test_missing_plan_file(tmp_path):
    with pytest.raises(PlanError, match="cannot read the sharding plan"):
        ShardPlan.load(tmp_path / "nope.json")


def test_decision_defaults_its_dim():
    assert Decision("w", "column", "mm").dim == 0 and Decision("w", "replicate", "mm").dim is None
