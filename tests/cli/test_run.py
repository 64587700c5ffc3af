"""`fxpass run` as a user runs it, and every bad input it must refuse in one clear line."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from _cli_helpers import fxpass, one_line_error, poisoned_copy

from fxpass.verify import verify_numerics


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def test_run_saves_verifies_and_reports(work: Path):
    r = fxpass("run", "tiny.pt2", "-p", "cse,dce", "-o", "out.pt2", "--report", "r.html",
               "--verify", "--json", cwd=work)  # fmt: skip
    assert r.code == 0, r.err
    data = json.loads(r.out)
    assert data["ok"] and data["modified"]
    assert [p["name"] for p in data["report"]["root"]["children"]] == ["cse", "dce"]
    assert data["numerics"]["final"]["ok"]
    assert [p["pass"] for p in data["numerics"]["passes"]] == ["cse"]
    assert "\x1b[" not in r.out + r.err  # no color when output is not a terminal
    original, saved = torch.export.load(work / "tiny.pt2"), torch.export.load(work / "out.pt2")
    assert len(saved.graph.nodes) < len(original.graph.nodes)
    assert verify_numerics(original, saved).ok
    page = (work / "r.html").read_text()
    assert "<svg" in page and "cse" in page
    assert _leftovers(work) == []


def test_run_prints_table_and_ir_after_change(work: Path):
    r = fxpass("run", "tiny.pt2", "-p", "cse,dce", "--print-after-change", "--timing", cwd=work)
    assert r.code == 0, r.err
    assert "cse" in r.out and "merged=" in r.out
    assert "// ----- IR after cse -----" in r.err  # IR goes to stderr, like MLIR's
    assert "IR after dce" not in r.err  # dce changed nothing here
    assert "Execution time report" in r.err


def test_missing_file(cli):
    r = cli("run", "nothere.pt2", "--json")
    assert r.code == 3
    assert "no such file: nothere.pt2" in one_line_error(r)
    data = json.loads(r.out)  # machines get the error as JSON on stdout too
    assert data["ok"] is False and data["exit_code"] == 3 and "nothere.pt2" in data["error"]


def test_each_command_in_one_process_prints_its_own_json(cli):
    """main() run twice in one process (a library's or a test's): the second command's
    error is still printed as JSON after the first printed its own object."""
    assert json.loads(cli("run", "tiny.fxgraph", "-p", "cse", "--json").out)["ok"]
    r = cli("run", "nothere.pt2", "--json")
    assert r.code == 3 and json.loads(r.out)["exit_code"] == 3


@pytest.mark.parametrize("damage", ["not a zip", "truncated"])
def test_corrupt_pt2(work: Path, cli, damage: str):
    data = (work / "tiny.pt2").read_bytes()
    bad = b"garbage" if damage == "not a zip" else data[: len(data) // 2] + data[-2000:]
    (work / "bad.pt2").write_bytes(bad)
    r = cli("run", "bad.pt2", "-p", "cse", "-o", "out.pt2")
    assert r.code == 3
    assert "bad.pt2" in one_line_error(r)
    assert not (work / "out.pt2").exists()


def test_pt2_with_pickled_code_is_refused_and_runs_nothing(work: Path):
    marker = work / "PWNED"
    poisoned_copy(work / "tiny.pt2", work / "evil.pt2", marker)
    r = fxpass("show", "evil.pt2", cwd=work)
    assert r.code == 3
    assert "refusing to load evil.pt2" in one_line_error(r)
    assert not marker.exists()


def test_malformed_spec(cli):
    r = cli("run", "tiny.pt2", "-p", "cse,{")
    assert r.code == 2
    line = one_line_error(r)
    assert "bad pipeline spec at column 5" in line


def test_unknown_pass_suggests(cli):
    r = cli("run", "tiny.pt2", "-p", "csee")
    assert r.code == 2
    assert "unknown pass 'csee'; did you mean 'cse'?" in one_line_error(r)


def test_bad_option_value(cli):
    r = cli("run", "tiny.pt2", "-p", "fixpoint{max_iterations=0}(cse)")
    assert r.code == 2  # a spec error with its column, checked before anything loads
    assert one_line_error(r) == (
        "error: bad pipeline spec at column 25 of 'fixpoint{max_iterations=0}(cse)': "
        "option 'max_iterations' expects int >= 1, got '0'"
    )


def test_pass_that_raises(work: Path):
    spec = "cse,planted_passes:explode"
    r = fxpass("run", "tiny.pt2", "-p", spec, "-o", "out.pt2", "--reproducer", "crash",
               cwd=work)  # fmt: skip
    assert r.code == 1
    line = one_line_error(r)
    assert "pass 'explode' failed: RuntimeError: planted failure in explode" in line
    assert "the input was left unchanged" in line
    assert "fxpass repro" in line
    assert not (work / "out.pt2").exists()
    assert _leftovers(work) == []
    # The reproducer fails the same way, with the same code.
    folder = next((work / "crash").iterdir())
    again = fxpass("repro", str(folder), cwd=work)
    assert again.code == 1
    assert "pass 'explode' failed: RuntimeError: planted failure in explode" in one_line_error(
        again
    )


def test_debug_shows_the_traceback(work: Path):
    r = fxpass("--debug", "run", "tiny.fxgraph", "-p", "planted_passes:explode", cwd=work)
    assert r.code == 1
    assert "Traceback" in r.err and "planted failure in explode" in r.err


def test_unwritable_output_fails_before_running(cli):
    r = cli("run", "tiny.pt2", "-p", "cse", "-o", "no/such/dir/out.pt2")
    assert r.code == 5
    assert "folder no/such/dir does not exist" in one_line_error(r)


def test_wrong_output_kind(cli):
    r = cli("run", "tiny.pt2", "-p", "cse", "-o", "out.fxgraph")
    assert r.code == 2
    assert "write it to a .pt2 file" in one_line_error(r)


def test_module_function_targets(cli):
    r = cli("run", "cli_targets:broken", "-p", "cse")
    assert r.code == 3
    assert "this target is broken on purpose" in one_line_error(r)


def test_fxgraph_target_round_trip(work: Path):
    from fxpass.core.serialize import load_graph

    r = fxpass("run", "tiny.fxgraph", "-p", "cse", "--verify", "-o", "g2.fxgraph", cwd=work)
    assert r.code == 0, r.err
    assert "numerics at the end: 1 output matches" in r.out
    gm, _ = load_graph(work / "tiny.fxgraph")
    gm2, inputs = load_graph(work / "g2.fxgraph")
    assert len(gm2.graph.nodes) < len(gm.graph.nodes) and inputs is not None


def test_verify_finds_a_divergence_in_a_graph_module(work: Path):
    r = fxpass("run", "tiny.fxgraph", "-p", "cse,planted_passes:add_as_sub_neg", "--verify",
               "-o", "g2.fxgraph", "--json", cwd=work)  # fmt: skip
    assert r.code == 4, r.err
    data = json.loads(r.out)
    assert not data["ok"] and not data["numerics"]["final"]["ok"]
    assert [p["pass"] for p in data["numerics"]["passes"]] == ["cse", "add_as_sub_neg"]
    assert data["numerics"]["first_divergence"]["pass"] == "add_as_sub_neg"
    assert "numerics diverged; g2.fxgraph not written" in one_line_error(r)
    assert not (work / "g2.fxgraph").exists()


def test_a_rule_that_tried_many_and_matched_few_says_where_it_came_close(work: Path):
    r = fxpass("run", "cli_targets:tiny_fp32", "-p", "cli_targets:strict_add_norm", cwd=work)
    assert r.code == 0, r.err
    hint = r.out[r.out.index("hint: strict_add_norm") :]
    assert "rule 'strict' was tried at" in hint and "near miss" in hint
    assert "extra user:" in hint and "fxpass.rewrite.explain(rule, gm)" in hint


# ----- --portable ----------------------------------------------------------------------------
CONSUMER = """
import importlib.util, sys
import torch
assert importlib.util.find_spec("fxpass") is None, "fxpass is installed here"
ep = torch.export.load(sys.argv[1])
torch.save(ep.module()(*torch.load(sys.argv[2])), sys.argv[3])
"""


def test_a_portable_program_runs_where_fxpass_is_not_installed(torch_only_python, tmp_path):
    """fxpass's fused ops lowered to torch's own: the program loads and runs in a virtual
    environment with torch only, and computes what the original program computed."""
    import subprocess

    from cli_targets import tiny_fp32

    ep = tiny_fp32()
    torch.export.save(ep, tmp_path / "tiny.pt2")
    args = ep.example_inputs[0]
    torch.save(args, tmp_path / "args.pt")
    r = fxpass("run", "tiny.pt2", "--portable", "-o", "portable.pt2", cwd=tmp_path)
    assert r.code == 0, r.err
    assert "lower_fused_ops" in r.out and f"wrote {tmp_path / 'portable.pt2'}" in r.out
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # no fxpass through it
    proc = subprocess.run(
        [str(torch_only_python), "-c", CONSUMER, "portable.pt2", "args.pt", "out.pt"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    torch.testing.assert_close(torch.load(tmp_path / "out.pt"), ep.module()(*args))
    shown = fxpass("show", "portable.pt2", cwd=tmp_path)
    assert "fxpass:" not in shown.out and "aten:" in shown.out


def test_show_says_which_ops_a_program_needs_and_who_registers_them(work: Path):
    r = fxpass("run", "tiny.pt2", "-o", "fused.pt2", cwd=work)
    assert r.code == 0, r.err
    shown = fxpass("show", "fused.pt2", "--json", cwd=work)
    ops = json.loads(shown.out)["ops"]
    assert ops["aten"]["registered_by"] == "torch"
    assert "fused_add_rmsnorm" in ops["fxpass"]["ops"]
    assert ops["fxpass"]["registered_by"] == "fxpass (fxpass.ops.norm)"
    assert "--portable" in ops["fxpass"]["note"]


@pytest.mark.parametrize("flag", ["--rtol", "--atol"])
def test_a_negative_tolerance_is_a_usage_error(work: Path, flag, capsys, monkeypatch):
    from _cli_helpers import in_process

    monkeypatch.chdir(work)
    r = in_process(["run", "tiny.fxgraph", "--verify", flag, "-1"], capsys, monkeypatch)
    assert r.code == 2
    assert "-1.0 is not in the range x>=0" in one_line_error(r)


@pytest.mark.parametrize("command", ["run", "show", "bisect"])
def test_an_empty_spec_is_a_usage_error(work: Path, command, capsys, monkeypatch):
    from _cli_helpers import in_process

    monkeypatch.chdir(work)
    r = in_process([command, "tiny.fxgraph", "-p", ""], capsys, monkeypatch)
    assert r.code == 2
    assert "the spec is empty" in one_line_error(r)


class _CubedNorm(torch.nn.Module):
    """An RMSNorm look-alike that cubes instead of squaring (a near miss of fuse_rmsnorm)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(8))

    def forward(self, x):
        h = x * torch.rsqrt(x.pow(3).mean(-1, keepdim=True) + 1e-6)
        return self.weight * h


def test_a_fusion_that_finds_nothing_names_the_near_miss_in_one_note(work: Path):
    ep = torch.export.export(_CubedNorm(), (torch.randn(2, 8),))
    torch.export.save(ep, work / "cubed.pt2")
    r = fxpass("run", "cubed.pt2", "-p", "fuse_rmsnorm", cwd=work)
    assert r.code == 0, r.err
    text = " ".join(r.out.split())  # the console wraps the note at its width
    assert text.count("note: fuse_rmsnorm:") == 1 and "hint:" not in text, r.out
    note = text[text.index("note: fuse_rmsnorm:") :]
    assert "closest near miss: 'rms_norm' at %mul_1: literal differs" in note
    assert "is 3, expected 2" in note and "says why" not in note
    # candidates tried, none close (no int8 cast anywhere): where explain() would help
    r = fxpass("run", "tiny.pt2", "-p", "fuse_add_rmsnorm_quant", cwd=work)
    text = " ".join(r.out.split())
    assert text.count("note: fuse_add_rmsnorm_quant:") == 1, r.out
    assert "near miss" not in text and "says why" in text, r.out
    ep = torch.export.export(torch.nn.Tanh(), (torch.randn(2, 8),))
    torch.export.save(ep, work / "tanh.pt2")
    r = fxpass("run", "tanh.pt2", "-p", "fuse_rmsnorm", cwd=work)  # not even a candidate
    text = " ".join(r.out.split())
    assert "'rms_norm': no node calls aten._to_copy.default" in text, r.out
    assert "near miss" not in text and "says why" not in text, r.out


def test_verify_without_a_float32_reference_says_so_in_text_and_json(work: Path):
    """bf16 outputs are judged against a float32 run of the original; when that run cannot be
    made, the text says so, not only --json (issue 28)."""
    args = ("run", "cli_targets:bf16_bitcast", "-p", "cse", "--verify")
    text = fxpass(*args, cwd=work)
    assert text.code == 0, text.err
    flat = " ".join(text.out.split())
    assert "no float32 reference (the float32 run of the original failed" in flat
    assert "judged by tolerance alone" in flat
    data = json.loads(fxpass(*args, "--json", cwd=work).out)
    assert "shape '[2, 2]' is invalid" in data["numerics"]["final"]["no_reference"]
    ok = fxpass("run", "cli_targets:bf16_no_grad", "-p", "cse", "--verify", cwd=work)
    assert ok.code == 0, ok.err
    assert "no float32 reference" not in ok.out  # its subgraph runs in float32 too


@pytest.mark.parametrize("extent", ["changed", "full"])
def test_run_verify_each(work: Path, extent: str):
    r = fxpass("run", "tiny.pt2", "-p", "cse,dce", "--verify-each", extent, "--json", cwd=work)
    assert r.code == 0, r.err
    assert json.loads(r.out)["modified"]


def test_run_verify_each_refuses_other_words(cli):
    r = cli("run", "tiny.pt2", "--verify-each", "some")
    assert r.code == 2
    assert "'some' is not one of 'changed', 'full'" in r.err
