"""``fxpass shard``: rank files, plan and manifest from a .pt2 over a mesh (-n, or --tp,
--ep, --pp); collectives counted by kind; bad input — plan files field by field, a plan
for another mesh, a mesh that does not fit — is one line."""

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


@pytest.fixture(scope="module")
def moe_pt2(tmp_path_factory):
    path = tmp_path_factory.mktemp("shard") / "moe.pt2"
    torch.export.save(exported(dtype=torch.float32, moe_experts=4), str(path))
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
    assert json.loads(out)["format"] == "fxpass.shard_plan/2"


@pytest.mark.parametrize(
    "args, code, message",
    [
        (["-n", "0", "-o", "x"], 2, "0 is not in the range x>=1"),
        (["-n", "2"], 2, "give -o/--output"),
        (["-n", "3", "-o", "{tmp}/o"], 1, "cannot split embed_tokens.weight evenly across 3"),
        (["-n", "2", "--plan", "{tmp}/none.json", "-o", "{tmp}/o"], 2, "cannot read the sharding"),
        (
            ["--plan", "{tmp}/bad.json", "-o", "{tmp}/o"],
            2,
            "plan field 'decisions[0].node' is missing",
        ),
        (
            ["-n", "4", "--plan", "{tmp}/p2.json", "-o", "{tmp}/o"],
            2,
            "made for world size 2 (tp 2), not 4",
        ),
        (
            ["--tp", "2", "--ep", "2", "--print-plan"],
            1,
            "ep 2 splits experts, but the program has no",
        ),
        (
            ["--pp", "3", "--print-plan"],
            1,
            "cannot cut the program into 3 pipeline stages: it has 1 layer",
        ),
        (["--print-plan"], 2, "give the number of ranks"),
        (["-n", "2", "-o", "{tmp}/no/such/dir"], 5, "does not exist"),
    ],
)
def test_bad_input_is_one_line(capsys, model_pt2, tmp_path, args, code, message):
    args = [a.format(tmp=tmp_path) for a in args]
    (tmp_path / "bad.json").write_text(
        '{"format": "fxpass.shard_plan/2", "mesh": {"tp": 2}, '
        '"decisions": [{"param": "w", "style": "row"}]}'
    )
    _run(capsys, "shard", str(model_pt2), "-n", "2", "--print-plan", "--json")
    (tmp_path / "p2.json").write_text(json.dumps({"format": "fxpass.shard_plan/2",
                                                  "mesh": {"tp": 2}, "decisions": []}))  # fmt: skip
    got, _, err = _run(capsys, "shard", str(model_pt2), *args)
    assert got == code and message in err and err.count("\n") == 1


def test_fuse_says_what_it_fused_or_why_not(capsys, model_pt2, tmp_path):
    code, out, _ = _run(capsys, "shard", str(model_pt2), "-n", "2", "--fuse",
                        "-o", str(tmp_path / "f"))  # fmt: skip
    assert code == 0 and "all-reduce + add + RMSNorm site" in out and " fused" in out
    code, out, _ = _run(capsys, "shard", str(model_pt2), "-n", "1", "--fuse",
                        "-o", str(tmp_path / "one"))  # fmt: skip
    assert code == 0 and "--fuse fused no site: one rank" in out


def test_the_table_counts_each_kind_of_collective(capsys, model_pt2, tmp_path):
    code, out, _ = _run(capsys, "shard", str(model_pt2), "-n", "2", "-o", str(tmp_path / "a"))
    assert code == 0 and "3 all_reduce, 1 all_gather" in out and "2 ranks" in out
    args = ["-n", "2", "--sequence-parallel", "-o", str(tmp_path / "b")]
    code, out, _ = _run(capsys, "shard", str(model_pt2), *args)
    assert code == 0 and "3 reduce_scatter" in out and "all_reduce" not in out


def test_a_mesh_from_the_command_line(capsys, model_pt2, tmp_path):
    args = ["--tp", "2", "--pp", "1", "-o", str(tmp_path / "m"), "--json"]
    code, out, _ = _run(capsys, "shard", str(model_pt2), *args)
    manifest = json.loads(out)
    assert code == 0 and manifest["mesh"] == {"tp": 2, "ep": 1, "pp": 1}
    code, out, _ = _run(capsys, "shard", str(model_pt2), "-n", "1", "-o", str(tmp_path / "one"))
    assert code == 0 and "1 rank" in out and "wrote 1 program," in out


def test_tp_ep_pp_is_the_python_equivalent(capsys, moe_pt2):
    import fxpass as fp

    args = ["--tp", "2", "--ep", "2", "--pp", "2", "--print-plan", "--json"]
    code, out, _ = _run(capsys, "shard", str(moe_pt2), *args)
    plan = fp.distributed.ShardPlan.from_dict(json.loads(out))
    assert code == 0 and plan.mesh == fp.distributed.Mesh(tp=2, ep=2, pp=2)
    assert len(plan.stages) == 2 and len(plan.experts) == 2 and plan.world_size == 8
    program = torch.export.load(str(moe_pt2))
    same = fp.distributed.analyze(program, mesh=fp.distributed.Mesh(tp=2, ep=2, pp=2))
    assert same.decisions == plan.decisions and same.experts == plan.experts
    assert plan.stages == fp.pipeline_stages(program, stages=2).stages
