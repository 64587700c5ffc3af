"""What every command shares: the one import rule (``--import`` and ``$FXPASS_IMPORT`` on
every command that loads a program), the one-line error that names the module a program's
unknown op needs, and error lines of bounded length whatever the user wrote."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from _cli_helpers import fxpass, in_process, one_line_error

from fxpass.core.run import MAX_NESTING
from fxpass.fxutil.messages import LINE_LIMIT

# A module that counts its imports: the tests drop it from sys.modules and look again.
COUNTED = "import builtins\nbuiltins.fxp_counted_imports = getattr(builtins, 'fxp_counted_imports', 0) + 1\n"


@pytest.mark.parametrize("how", ["flag", "env"])
@pytest.mark.parametrize(
    "args",
    [
        ["list"],
        ["show", "tiny.fxgraph"],
        ["run", "tiny.fxgraph", "-p", "cse"],
        ["diff", "tiny.fxgraph", "tiny.fxgraph"],
        ["bisect", "tiny.fxgraph", "-p", "cse"],
        ["repro", "tiny.fxgraph", "-p", "cse"],
        ["shard", "tiny.pt2", "-n", "1", "--print-plan"],
    ],
    ids=lambda a: a[0],
)
def test_every_command_that_loads_takes_the_import_rule(args, how, work: Path, monkeypatch, capsys):
    import builtins

    (work / "fxp_counted.py").write_text(COUNTED)
    monkeypatch.chdir(work)
    monkeypatch.delitem(sys.modules, "fxp_counted", raising=False)
    monkeypatch.setattr(builtins, "fxp_counted_imports", 0, raising=False)
    if how == "flag":
        args = [*args, "--import", "fxp_counted"]
    else:
        monkeypatch.setenv("FXPASS_IMPORT", "fxp_counted")
    r = in_process(args, capsys, monkeypatch)
    assert r.code == 0, r.err
    assert builtins.fxp_counted_imports == 1


@pytest.fixture(scope="module")
def moe_pt2(tmp_path_factory) -> Path:
    """A tiny fp32 OLMoE (random weights): its experts call transformers::grouped_mm_fallback."""
    _hf = pytest.importorskip("_hf")  # transformers
    path = tmp_path_factory.mktemp("moe") / "olmoe.pt2"
    ep = _hf.exported("olmoe", layers=1)
    assert any("grouped_mm_fallback" in str(n.target) for n in ep.graph.nodes)
    torch.export.save(ep, path)
    return path


def test_shard_an_hf_moe_needs_the_module_that_registers_its_op(moe_pt2: Path, tmp_path):
    """Found by reading the installed sources: the error names the module and the flag."""
    r = fxpass("shard", str(moe_pt2), "-n", "2", "-o", "out", cwd=tmp_path)
    assert r.code == 3
    line = one_line_error(r)
    assert "torch.ops.transformers.grouped_mm_fallback" in line
    assert "--import transformers.integrations.moe" in line
    assert line.endswith("or --import auto")
    ok = fxpass("shard", str(moe_pt2), "-n", "2", "-o", "out", "--import", "transformers",
                "--import", "transformers.integrations.moe", cwd=tmp_path)  # fmt: skip
    assert ok.code == 0, ok.err
    assert "wrote 2 programs" in ok.out
    assert sorted(p.name for p in (tmp_path / "out").glob("rank*.pt2")) == [
        "rank0.pt2",
        "rank1.pt2",
    ]


NOTE = (
    "note: importing transformers.integrations.moe, which registers "
    "transformers::grouped_mm_fallback, called by the program (--import auto)"
)


def test_import_auto_imports_the_module_fxpass_names_and_says_so(moe_pt2: Path, tmp_path):
    """Allowed once (``--import auto``), the module the error names is imported: never
    silently (a fresh process: nothing imported it before)."""
    r = fxpass("show", str(moe_pt2), "--import", "auto", cwd=tmp_path)
    assert r.code == 0, r.err
    assert NOTE in " ".join(r.err.split())
    assert "grouped_mm_fallback" in r.out


def test_fxpass_import_auto_in_the_environment_allows_it_for_every_command(moe_pt2, tmp_path):
    env = {"FXPASS_IMPORT": "auto"}
    r = fxpass("run", str(moe_pt2), "-p", "cse", "-o", "out.pt2", "--reproducer", "rep",
               cwd=tmp_path, env=env)  # fmt: skip
    assert r.code == 0, r.err
    assert NOTE in " ".join(r.err.split())
    assert (tmp_path / "out.pt2").is_file()


def test_import_auto_imports_nothing_a_program_does_not_need(work: Path, capsys, monkeypatch):
    monkeypatch.chdir(work)
    r = in_process(["show", "tiny.pt2", "--import", "auto"], capsys, monkeypatch)
    assert r.code == 0, r.err
    assert "importing" not in r.err


# ----- error lines: one line of bounded length, whatever the user wrote ---------------------
HUGE = "x" * 100_000


@pytest.mark.parametrize(
    ("args", "code", "says"),
    [
        (["run", "tiny.fxgraph", "-p", HUGE], 2, "unknown pass 'xxx"),
        (["run", "tiny.fxgraph", "-p", f"cse,fixpoint({HUGE})"], 2, "unknown pass 'xxx"),
        (["run", "tiny.fxgraph", "-p", f"cse{{{HUGE}=1}}"], 2, "takes no options, but got"),
        (["run", "tiny.fxgraph", "-p", f"fixpoint{{max_iterations={HUGE}}}(cse)"], 2,
         "expects int >= 1"),
        (["run", "tiny.fxgraph", "-p", f"{HUGE}:fn"], 2, "cannot import pass 'xxx"),
        (["run", "tiny.fxgraph", "-p", "cse", "--import", HUGE], 3, "cannot import xxx"),
        (["show", HUGE + ".pt2"], 3, "no such file: xxx"),
        (["show", HUGE], 3, "no such file: xxx"),
        (["show", f"no_such_module:{HUGE}"], 3, "cannot import TARGET no_such_module:xxx"),
        (["diff", "tiny.fxgraph", HUGE + ".fxgraph"], 3, "no such file: xxx"),
        (["run", "tiny.fxgraph", "-p", "cse", "-o", HUGE + ".fxgraph"], 5,
         "cannot write the output to xxx"),
        (["run", "tiny.fxgraph", "-p", "cse", "--report", HUGE + ".html"], 5,
         "cannot write the report to xxx"),
        (["run", "tiny.fxgraph", "-p", "cse", "--cache", HUGE], 5, "pipeline cache folder"),
        (["run", "tiny.fxgraph", "-p", "cse", "--rtol", HUGE], 2, "--rtol"),
        (["run", "tiny.fxgraph", "--" + HUGE], 2, "No such option"),
    ],
    ids=["pass", "nested-pass", "option", "value", "import-pass", "--import", "pt2", "file",
         "function", "diff", "output", "report", "cache", "rtol", "flag"],
)  # fmt: skip
def test_a_100000_character_input_gives_a_short_error_line(
    args, code, says, work, capsys, monkeypatch
):
    monkeypatch.chdir(work)
    r = in_process(args, capsys, monkeypatch)
    assert r.code == code, r.err[:1000]
    line = one_line_error(r)
    assert len(line) <= len("error: ") + LINE_LIMIT
    assert says in line
    assert "characters" in line  # says how long the input was


def test_the_installed_command_caps_its_error_line_and_json(tmp_path: Path):
    """Through the real command: a 100,000-character pass name was a 200 KB line (issue 28)."""
    r = fxpass("run", "no_such.fxgraph", "-p", f"cse,{HUGE}", "--json", cwd=tmp_path)
    assert r.code == 2
    line = one_line_error(r)
    assert len(line) < 400
    assert "unknown pass 'xxx" in line and "(100,000 characters)" in line
    assert len(json.loads(r.out)["error"]) < 400


@pytest.mark.parametrize("open_", ["fixpoint(", "pipeline(", "fixpoint{max_iterations=3}( "])
def test_a_spec_nested_500_deep_is_a_usage_error(open_, work, capsys, monkeypatch):
    monkeypatch.chdir(work)
    spec = open_ * 500 + "cse" + ")" * 500
    r = in_process(["run", "tiny.fxgraph", "-p", spec], capsys, monkeypatch)
    assert r.code == 2
    line = one_line_error(r)
    assert f"more than {MAX_NESTING} levels deep" in line and len(line) < 400


def test_a_spec_nested_to_the_limit_runs_reports_and_caches(work, capsys, monkeypatch):
    monkeypatch.chdir(work)
    spec = "fixpoint(" * MAX_NESTING + "cse,dce" + ")" * MAX_NESTING
    args = ["run", "tiny.fxgraph", "-p", spec, "--timing", "--verify", "--report", "r.html",
            "-o", "out.fxgraph", "--json"]  # fmt: skip
    r = in_process(args, capsys, monkeypatch)
    assert r.code == 0, r.err[-2000:]
    data = json.loads(r.out)
    assert data["ok"] and (work / "r.html").is_file() and (work / "out.fxgraph").is_file()
    cached = ["run", "tiny.fxgraph", "-p", spec, "--cache", "cache", "--json"]
    first, again = (in_process(cached, capsys, monkeypatch) for _ in range(2))
    assert first.code == again.code == 0, first.err[-2000:] + again.err[-2000:]
    assert not json.loads(first.out)["report"]["cached"]
    assert json.loads(again.out)["report"]["cached"]  # the same key for the same deep spec
