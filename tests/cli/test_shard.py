"""``fxpass shard``: rank files, plan and manifest from a .pt2; bad input is one line."""

from __future__ import annotations

import json

import pytest
import torch

from fxpass.cli import main

from _models import exported


@pytest.fixture(scope="module")
def model_pt2(tmp_path_factory):
    path = tmp_path_factory.mktemp("shard") / "model.pt2"
    torch.export.save(exported(dtype=torch.float32, layers=1), str(path))
    return path


def _run(capsys, *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as e:
        main(list(args))
    out = capsys.readouterr()
    return e.value.code, out.out, out.err


def test_writes_rank_files_plan_and_manifest(capsys, model_pt2, tmp_path):
    code, out, _ = _run(capsys, "shard", str(model_pt2), "-n", "2", "-o", str(tmp_path / "o"))
    assert code == 0 and "wrote 2 programs" in out and "of unsharded" in out
    names = sorted(p.name for p in (tmp_path / "o").iterdir())
    assert names == ["manifest.json", "plan.json", "rank0.pt2", "rank1.pt2"]
    plan = tmp_path / "o" / "plan.json"
    code, out, _ = _run(
        capsys, "shard", str(model_pt2), "-n", "2", "--plan", str(plan), "--sequence-parallel",
        "--fuse", "-o", str(tmp_path / "p"), "--json",
    )  # fmt: skip
    manifest = json.loads(out)
    assert code == 0 and manifest["options"]["sequence_parallel"] and manifest["world_size"] == 2


def test_print_plan_only(capsys, model_pt2):
    code, out, _ = _run(capsys, "shard", str(model_pt2), "-n", "2", "--print-plan")
    assert code == 0 and "column-parallel" in out and "vocab-parallel" in out
    code, out, _ = _run(capsys, "shard", str(model_pt2), "-n", "2", "--print-plan", "--json")
    assert json.loads(out)["format"] == "fxpass.shard_plan/1"


@pytest.mark.parametrize(
    "args, code, message",
    [
        (["-n", "0", "-o", "x"], 2, "0 is not in the range x>=1"),
        (["-n", "2"], 2, "give -o/--output"),
        (["-n", "3", "-o", "{tmp}/o"], 1, "cannot split embed_tokens.weight evenly across 3"),
        (["-n", "2", "--plan", "{tmp}/none.json", "-o", "{tmp}/o"], 1, "cannot read the sharding"),
        (["-n", "2", "-o", "{tmp}/no/such/dir"], 5, "does not exist"),
    ],
)
def test_bad_input_is_one_line(capsys, model_pt2, tmp_path, args, code, message):
    args = [a.format(tmp=tmp_path) for a in args]
    got, _, err = _run(capsys, "shard", str(model_pt2), *args)
    assert got == code and message in err and err.count("\n") == 1


def test_fuse_says_what_it_fused_or_why_not(capsys, model_pt2, tmp_path):
    code, out, _ = _run(capsys, "shard", str(model_pt2), "-n", "2", "--fuse",
                        "-o", str(tmp_path / "f"))  # fmt: skip
    assert code == 0 and "all-reduce + add + RMSNorm site" in out and " fused" in out
    code, out, _ = _run(capsys, "shard", str(model_pt2), "-n", "1", "--fuse",
                        "-o", str(tmp_path / "one"))  # fmt: skip
    assert code == 0 and "--fuse: " in out and "fused" not in out.split("--fuse: ")[1][:9]
