"""`fxpass --help`, list, show, diff, bisect and demo, driven as a user drives them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import planted_passes
import pytest
import torch
from _cli_helpers import fxpass

from fxpass.core.serialize import load_graph


def test_help_documents_exit_codes(tmp_path: Path):
    r = fxpass("--help", cwd=tmp_path)
    assert r.code == 0
    for code in ("0 ", "1 ", "2 ", "3 ", "4 ", "5 ", "70 "):
        assert f"\n    {code}" in r.out, r.out
    for command in ("demo", "list", "show", "run", "diff", "bisect", "repro"):
        assert command in r.out


def test_list_json(tmp_path: Path):
    r = fxpass("list", "--json", cwd=tmp_path)
    assert r.code == 0, r.err
    data = json.loads(r.out)
    by_name = {p["name"]: p for p in data["passes"]}
    assert "max_iterations" in by_name["fixpoint"]["options"]
    assert by_name["fixpoint"]["summary"].startswith("Run the nested passes")
    assert r.err == ""  # no warnings on a clean run
    assert isinstance(data["default"], list)


def test_list_reads_at_80_columns(monkeypatch, capsys):
    from fxpass.cli import main
    from fxpass.core.pass_registry import REGISTRY

    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit) as exit_:
        main(["list"])
    out, err = capsys.readouterr()
    assert exit_.value.code == 0 and err == ""
    lines = out.splitlines()
    assert max(len(line.rstrip()) for line in lines) <= 80
    assert "…" not in out and "``" not in out and ":func:" not in out
    flat = " ".join(line.strip() for line in lines)
    for info in REGISTRY.infos():  # every name and option shows in full (wrapped, not cut)
        assert any(line.startswith(info.name + " ") for line in lines)
        for option in info.options:
            assert f"{option}: " in flat


def test_show_before_and_after_one_pass(work: Path):
    r = fxpass("show", "tiny.fxgraph", "--pass", "planted_passes:add_as_sub_neg", cwd=work)
    assert r.code == 0, r.err
    before, after = r.out.split("after planted_passes:add_as_sub_neg", 1)
    assert after.count("aten.add.Tensor") < before.count("aten.add.Tensor")
    assert after.count("aten.neg.default") > before.count("aten.neg.default")
    assert "add_as_sub_neg: +" in after  # the change summary at the end


def test_diff_between_two_files(work: Path):
    gm, inputs = load_graph(work / "tiny.fxgraph")
    planted_passes.add_as_sub_neg(gm)
    gm.recompile()
    from fxpass.core.serialize import save_graph

    save_graph(gm, work / "changed.fxgraph", inputs)
    r = fxpass("diff", "tiny.fxgraph", "changed.fxgraph", "--json", "--exit-code",
               "--report", "diff.html", cwd=work)  # fmt: skip
    assert r.code == 1, r.err
    data = json.loads(r.out)
    n = len(planted_passes.candidates(load_graph(work / "tiny.fxgraph")[0]))
    assert not data["same"]
    assert data["changes"]["removed"] == n
    adds = data["op_counts"]["aten.add.Tensor"]
    assert adds[0] - adds[1] == n
    assert "<svg" in (work / "diff.html").read_text()
    same = fxpass("diff", "tiny.fxgraph", "tiny.fxgraph", "--exit-code", cwd=work)
    assert same.code == 0 and "the graphs are the same" in same.out


def test_bisect_finds_the_planted_rewrite(work: Path):
    """The planted bug is found down to the exact rewrite, in the exported program."""
    ep = torch.export.load(work / "tiny.pt2")
    gm = ep.graph_module
    k = planted_passes.planted_index(gm)
    culprit = planted_passes.candidates(gm)[k - 1].name
    r = fxpass("bisect", "tiny.pt2", "-p", "cse,planted_passes:add_as_sub_neg,dce", "--json",
               cwd=work)  # fmt: skip
    assert r.code == 4, r.err
    data = json.loads(r.out)
    assert data["first_bad_pass"]["pass"] == "add_as_sub_neg"
    assert data["rewrite"]["pass_index"] == k  # the k-th rewrite of the planted pass
    assert data["rewrite"]["index"] > k  # counted over the run: cse asked first
    assert data["rewrite"]["total"] > len(planted_passes.candidates(gm))
    assert data["rewrite"]["pass_path"] == "add_as_sub_neg"
    assert data["rewrite"]["rule"] == planted_passes.RULE
    assert data["rewrite"]["old"] == [culprit]


def test_bisect_when_numerics_hold(work: Path):
    r = fxpass("bisect", "tiny.fxgraph", "-p", "cse,dce", cwd=work)
    assert r.code == 0, r.err
    assert "numerics hold after every pass of 'cse,dce'" in r.out


def test_demo(tmp_path: Path):
    r = fxpass("demo", "--layers", "1", cwd=tmp_path)
    assert r.code == 0, r.err
    assert "fxpass demo: tiny Llama decoder (1 layer), default pipeline" in r.out
    assert "pipeline: default" in r.out  # the per-pass table
    assert "numerics against the original: 1 output matches" in r.out
    assert f"wrote {tmp_path / 'report.html'}" in r.out  # absolute
    assert r.err == ""  # no third-party warnings on a clean run
    page = (tmp_path / "report.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "Passes" in page and "Numerics" in page
    if "changed," in r.out:  # once the default pipeline changes the graph: a block is shown
        assert "one changed block" in r.out and "<svg" in page


def test_demo_json_in_process(tmp_path: Path, monkeypatch):
    from click.testing import CliRunner

    from fxpass.cli import cli

    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["demo", "--layers", "1", "--json", "--no-report"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["numerics"]["ok"] and data["html"] is None
    assert data["report"]["root"]["name"] == "default"
    assert not (tmp_path / "report.html").exists()
    if data["modified"]:
        assert data["fused_block"]["after"]


def test_color_when_forced_and_never_with_no_color(tmp_path: Path):
    # Piped output has no colour: every other test's output is checked by _cli_helpers.
    forced = fxpass("list", cwd=tmp_path, env={"FORCE_COLOR": "1", "TERM": "xterm-256color"})
    assert "\x1b[" in forced.out  # rich treats FORCE_COLOR as a terminal
    plain = fxpass("list", cwd=tmp_path,
                   env={"FORCE_COLOR": "1", "TERM": "xterm-256color", "NO_COLOR": "1"})  # fmt: skip
    assert not re.search(r"\x1b\[[0-9;]*3[0-9]m", plain.out)  # no colours, whatever else
