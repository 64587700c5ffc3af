"""Adding a strategy is what docs/architecture.md's "Adding a distributed strategy" says: one
module under ``distributed/`` that defines ``STRATEGY`` — proved by following the recipe in a
copy of the package and sharding a program with it (its section in the plan, its analysis,
its preparation and its rewrite on every rank, handed the run's context)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import fxpass.distributed as dist

ROOT = Path(__file__).resolve().parents[2]


def _recipe() -> tuple[str, str]:
    """The file the recipe writes and its text, read from docs/architecture.md."""
    doc = (ROOT / "docs" / "architecture.md").read_text()
    section = doc[doc.index("## Adding a distributed strategy\n") :]
    section = section[: section.index("\n## ", 1)]
    path = re.search(r"a new file\s+`(src/fxpass/distributed/\w+\.py)`:", section)
    block = re.search(r"^( *)```py\n(.*?)^\1```$", section, re.S | re.M)
    assert path is not None and block is not None, "the recipe shows a strategy file and its path"
    return path.group(1), textwrap.dedent(block.group(2))


_PROBE = """
import json, sys
import torch
import fxpass as fp
from fxpass.distributed import ShardPlan, strategies

name, copy = sys.argv[1:3]
assert fp.__file__.startswith(copy), fp.__file__  # the copy, not the checkout


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(16, 64, bias=False)
        self.down = torch.nn.Linear(64, 16, bias=False)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


torch.manual_seed(0)
model = MLP()
x = torch.randn(4, 16)
ep = torch.export.export(model, (x,))
shards = fp.shard(ep, tp=2)
data = shards.plan.to_dict()
again = ShardPlan.from_dict(json.loads(json.dumps(data)))
print(json.dumps({
    "strategies": [s.name for s in strategies()],
    "section": data.get(name),
    "round_trip": again == shards.plan,
    "stats": [r.stats() for r in shards.reports],
    "whole": sum(p.numel() * p.element_size() for p in model.parameters()),
    "rank_weights": [shards.rank_bytes(r) for r in range(2)],
}))
"""


def test_the_recipe_is_one_module(tmp_path):
    rel, text = _recipe()
    name = Path(rel).stem
    assert name not in [s.name for s in dist.strategies()]  # the checkout has no such strategy
    shutil.copytree(ROOT / "src", tmp_path / "src", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / rel).write_text(text)
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "src")}
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, name, str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    # the table found it, after tensor parallelism (its order)
    assert got["strategies"].index(name) > got["strategies"].index("tensor_parallel")
    # its section: one entry per linear, written and read back by the plan
    assert [e["node"] for e in got["section"]] == ["linear", "linear_1"]
    assert got["round_trip"]
    # its rewrite ran on each rank, after the weights were cut, reading them from ctx.program
    counted = [s[f"{name}.weight_bytes"] for s in got["stats"]]
    assert counted == got["rank_weights"] == [got["whole"] // 2] * 2
