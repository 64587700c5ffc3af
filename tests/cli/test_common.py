"""What every command shares: the one import rule (``--import`` and ``$FXPASS_IMPORT`` on
every command that loads a program), and the one-line error that names the module a
program's unknown op needs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from _cli_helpers import fxpass, one_line_error
from test_targets import in_process

_hf = pytest.importorskip("_hf")

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
    ok = fxpass("shard", str(moe_pt2), "-n", "2", "-o", "out", "--import", "transformers",
                "--import", "transformers.integrations.moe", cwd=tmp_path)  # fmt: skip
    assert ok.code == 0, ok.err
    assert "wrote 2 programs" in ok.out
    assert sorted(p.name for p in (tmp_path / "out").glob("rank*.pt2")) == [
        "rank0.pt2",
        "rank1.pt2",
    ]
