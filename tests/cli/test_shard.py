"""``fxpass shard``: rank files, plan and manifest from a .pt2 over a mesh (-n, or --tp,
--ep, --pp); collectives counted by kind; bad input — plan files field by field, a plan
for another mesh, a mesh that does not fit — is one line."""

from __future__ import annotations

import json

import pytest
import torch
from _html_report import drawn_nodes

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
    assert plan.stages == fp.distributed.pipeline_stages(program, stages=2).stages


def test_report_draws_each_ranks_inserted_collectives(capsys, model_pt2, tmp_path):
    """--report: one HTML report per rank whose change list draws the collectives the
    strategies inserted through the editor, each naming the node it serves."""
    html = tmp_path / "shard.html"
    code, out, _ = _run(capsys, "shard", str(model_pt2), "-n", "2", "-o", str(tmp_path / "o"),
                        "--sequence-parallel", "--report", str(html))  # fmt: skip
    paths = [tmp_path / f"shard.rank{r}.html" for r in range(2)]
    assert code == 0 and all(p.is_file() for p in paths) and not html.exists()
    assert "report: " in out and str(paths[1]) in out.replace("\n", "")
    for path in paths:
        new = [d for d in drawn_nodes(path) if d["status"] == "new"]
        passes = {d["provenance"]["pass"] for d in new if "_c10d_functional" in d["target"]}
        assert passes >= {"tensor_parallel", "sequence_parallel"}, path.name
        for d in new:
            assert d["from_node"] and d["provenance"]["replaced"], d
    code, out, _ = _run(capsys, "shard", str(model_pt2), "-n", "2", "-o", str(tmp_path / "j"),
                        "--report", str(tmp_path / "j.html"), "--json")  # fmt: skip
    assert json.loads(out)["reports"] == [str(tmp_path / f"j.rank{r}.html") for r in range(2)]


# ----- rank consistency: fxpass shard --verify, fxpass check-ranks ------------------------------
def test_verify_and_check_ranks_pass_real_programs(capsys, model_pt2, tmp_path):
    code, out, _ = _run(capsys, "shard", str(model_pt2), "-n", "2", "--verify")
    assert code == 0 and "consistent: the 2 ranks issue the same" in out
    code, out, _ = _run(capsys, "shard", str(model_pt2), "-n", "2", "--verify", "-o",
                        str(tmp_path / "o"))  # fmt: skip
    assert code == 0 and "consistent" in out and "wrote 2 programs" in out
    files = [str(tmp_path / "o" / f"rank{r}.pt2") for r in range(2)]
    code, out, _ = _run(capsys, "check-ranks", *files)
    assert (code, out.count("\n")) == (0, 1) and "consistent" in out


def test_check_ranks_names_each_fault_on_each_rank(capsys, model_pt2, tmp_path):
    import sys

    from fxpass.targets.export import load

    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parents[1] / "distributed"))
    from _planted_collective import drop_collective, misshape_collective

    _run(capsys, "shard", str(model_pt2), "-n", "4", "-o", str(tmp_path / "o"))
    ranks = [load(tmp_path / "o" / f"rank{r}.pt2") for r in range(4)]
    for rank, plant in ((1, drop_collective), (3, misshape_collective)):
        gm, _ = plant(ranks[rank], 1)
        ep = ranks[rank]
        planted = torch.export.ExportedProgram(
            gm, gm.graph, ep.graph_signature, ep.state_dict, ep.range_constraints,
            ep.module_call_graph, constants=ep.constants,
        )  # fmt: skip
        torch.export.save(planted, str(tmp_path / f"bad{rank}.pt2"))
    files = [str(tmp_path / "o" / "rank0.pt2"), str(tmp_path / "bad1.pt2"),
             str(tmp_path / "o" / "rank2.pt2"), str(tmp_path / "bad3.pt2")]  # fmt: skip
    code, out, _ = _run(capsys, "check-ranks", *files)
    lines = out.strip().splitlines()
    assert code == 1 and len(lines) == 2
    assert "rank 0 runs 'all_reduce_default'" in lines[0] and "rank 1 has none there" in lines[0]
    assert "rank 3 runs 'all_reduce_default' (all_reduce sum f32[8, 32])" in lines[1]
    code, out, _ = _run(capsys, "check-ranks", *files, "--json")
    assert code == 1 and [f["ranks"] for f in json.loads(out)["faults"]] == [[0, 1], [0, 3]]
    code, _, err = _run(capsys, "check-ranks", *files[:3])
    assert code == 2 and "the mesh tp 4 has 4 ranks, but 3 programs were given" in err
    code, _, err = _run(capsys, "check-ranks", files[1], str(tmp_path / "none.pt2"))
    assert code == 3 and "no such file" in err


def test_report_prints_collectives_and_bytes_per_layer(capsys, model_pt2, tmp_path):
    code, out, _ = _run(capsys, "shard", str(model_pt2), "-n", "2", "-o", str(tmp_path / "o"),
                        "--report")  # fmt: skip
    assert code == 0 and "communication per forward, every rank: tensor parallel" in out
    assert "layers.0" in out and "every layer of every rank is at the minimum" in out
    code, out, _ = _run(capsys, "shard", str(model_pt2), "-n", "2", "-o", str(tmp_path / "j"),
                        "--report", "--json")  # fmt: skip
    rows = json.loads(out)["communication"]["ranks"][0]
    assert rows[0] == {"layer": "layers.0", "counts": {"all_reduce": 2}, "bytes": 4096,
                       "minimum_count": 2, "minimum_bytes": 4096, "extra": []}  # fmt: skip


def test_bucket_async_tp_and_gates_from_the_command_line(capsys, moe_pt2, tmp_path):
    code, out, _ = _run(capsys, "shard", str(moe_pt2), "-n", "2", "-o", str(tmp_path / "b"),
                        "--bucket", "--verify")  # fmt: skip
    assert code == 0 and "bucket: applied: adjacent small collectives" in out
    assert "launches before 8" in out and "launches after 6" in out and "consistent" in out
    plan = json.loads((tmp_path / "b" / "plan.json").read_text())
    assert plan["options"]["bucket"] == 64 * 1024 and plan["applied"][0]["applied"]
    code, out, _ = _run(capsys, "shard", str(moe_pt2), "-n", "2", "-o", str(tmp_path / "a"),
                        "--sequence-parallel", "--async-tp", "--gate", "async_tp=16..",
                        "--bucket", "1024")  # fmt: skip
    assert code == 0 and "sequence_parallel: applied" in out
    assert "async_tp: not applied: skipped: applies to tokens:16.." in out
    assert "bucket: not applied: found nothing to change" in out
    code, _, err = _run(capsys, "shard", str(moe_pt2), "-n", "2", "-o", str(tmp_path / "c"),
                        "--gate", "overlap=1..8")  # fmt: skip
    assert code == 2 and "no option 'overlap' to gate" in err
    code, _, err = _run(capsys, "shard", str(moe_pt2), "-n", "2", "-o", str(tmp_path / "c"),
                        "--gate", "async_tp")  # fmt: skip
    assert code == 2 and "--gate takes OPTION=LO..HI" in err
