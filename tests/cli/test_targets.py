"""Loading TARGETs as users save them: Hugging Face .pt2 files in a fresh process, --import,
damaged archives, and the one import rule (the current folder) in every command."""

from __future__ import annotations

import json
import os
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from _cli_helpers import flip_bytes, fxpass, in_process, one_line_error

FUSED_ADD = torch.ops.fxpass.fused_add_rmsnorm.default
FUSED = torch.ops.fxpass.rms_norm.default
LAYERS = 2


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> Path:
    """llama.pt2 and qwen2.pt2, saved as users save them, and a `transformers` that cannot
    be imported (blocked/), to prove a process without it loads them."""
    _hf = pytest.importorskip("_hf")  # transformers
    folder = tmp_path_factory.mktemp("hf")
    for family in ("llama", "qwen2"):
        torch.export.save(_hf.exported(family, layers=LAYERS), folder / f"{family}.pt2")
    blocked = folder / "blocked" / "transformers"
    blocked.mkdir(parents=True)
    (blocked / "__init__.py").write_text("raise ImportError('transformers is blocked here')\n")
    return folder


def _without_transformers(folder: Path) -> dict[str, str]:
    return {
        "PYTHONPATH": os.pathsep.join([str(folder / "blocked"), os.environ.get("PYTHONPATH", "")])
    }


def _count(gm: torch.fx.GraphModule, target) -> int:
    return sum(n.op == "call_function" and n.target is target for n in gm.graph.nodes)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_hugging_face_pt2_runs_fused_and_verified_in_a_fresh_process(family, hf_dir, tmp_path):
    (tmp_path / "model.pt2").write_bytes((hf_dir / f"{family}.pt2").read_bytes())
    env = _without_transformers(hf_dir)
    r = fxpass("run", "model.pt2", "--verify", "-o", "out.pt2", "--json", cwd=tmp_path, env=env)
    assert r.code == 0, r.err
    summary = json.loads(r.out)
    assert summary["ok"] and summary["numerics"]["final"]["ok"]
    assert summary["output"] == str(tmp_path / "out.pt2")  # absolute
    assert "CausalLMOutputWithPast" in r.err and "stand-in" in r.err  # the one-line note
    # Written back unchanged: torch.export.load (transformers imported here) gives the real type.
    _hf = pytest.importorskip("_hf")
    saved, original = torch.export.load(tmp_path / "out.pt2"), _hf.exported(family, layers=LAYERS)
    ids = _hf.example_inputs()
    out = saved.module()(*ids)
    assert type(out).__name__ == "CausalLMOutputWithPast"
    torch.testing.assert_close(out.logits, original.module()(*ids).logits, rtol=1e-4, atol=1e-5)
    # Every norm site is fused: two per layer (the first after the embedding has no add),
    # and the final norm.
    gm = saved.graph_module
    assert _count(gm, FUSED_ADD) == 2 * LAYERS
    assert _count(gm, FUSED) == 1
    assert _count(gm, torch.ops.aten.rsqrt.default) == 0
    if family == "llama":  # fxpass reads its output back, and --import gives the real type
        shown = fxpass("show", "out.pt2", "--import", "transformers", cwd=tmp_path)
        assert shown.code == 0, shown.err
        assert "fused_add_rmsnorm" in shown.out and "stand-in" not in shown.err


def test_imports_come_from_the_environment_then_the_flags(monkeypatch):
    from fxpass.cli._common import allowed_imports

    monkeypatch.setenv("FXPASS_IMPORT", "transformers, my_ops  other")
    assert allowed_imports(("my_ops", "extra")) == ["transformers", "my_ops", "other", "extra"]


def test_a_missing_module_to_import(work: Path, capsys, monkeypatch):
    monkeypatch.chdir(work)
    r = in_process(["show", "tiny.fxgraph", "--import", "no_such_module_here"], capsys, monkeypatch)
    assert r.code == 3
    line = one_line_error(r)
    assert "cannot import no_such_module_here" in line and "ModuleNotFoundError" in line


def test_a_corrupted_weight_is_refused_and_nothing_is_written(work: Path, capsys, monkeypatch):
    member = flip_bytes(work / "tiny.pt2", work / "bad.pt2", "data/weights/weight_1", 200)
    monkeypatch.chdir(work)
    r = in_process(
        ["run", "bad.pt2", "-p", "cse", "-o", "out.pt2", "--verify"], capsys, monkeypatch
    )
    assert r.code == 3
    assert f"member {member} fails its checksum" in one_line_error(r)
    assert not (work / "out.pt2").exists()


# ----- the one import rule ---------------------------------------------------------------------
MY_PASSES = "def fine(gm):\n    return False\n"


@pytest.mark.parametrize(
    "args",
    [
        ["run", "tiny.fxgraph", "-p", "my_passes:fine"],
        ["show", "tiny.fxgraph", "-p", "my_passes:fine"],
        ["bisect", "tiny.fxgraph", "-p", "my_passes:fine"],
        ["repro", "tiny.fxgraph", "-p", "my_passes:fine"],
        ["run", "my_targets:tiny", "-p", "cse"],
        ["diff", "tiny.fxgraph", "my_targets:tiny"],
        ["show", "tiny.fxgraph", "--import", "my_passes"],
    ],
    ids=["run", "show", "bisect", "repro", "target", "diff", "import"],
)
def test_the_current_folder_is_on_the_import_path_in_every_command(
    work: Path, args, monkeypatch, capsys
):
    """As the console script runs: the current folder is not on sys.path by itself."""
    (work / "my_passes.py").write_text(MY_PASSES)
    (work / "my_targets.py").write_text(
        "from fxpass.models.llama import build_decoder\n\n"
        "def tiny():\n    m = build_decoder(layers=1)\n    return m, m.example_inputs()\n"
    )
    monkeypatch.chdir(work)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(work))])
    for name in ("my_passes", "my_targets"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    r = in_process(args, capsys, monkeypatch)
    assert r.code == 0, r.err


# ----- hostile and malformed .pt2 files: one line, exit 3, nothing run, nothing written --------
def _hostile_size(marker: Path) -> Callable[[dict], None]:
    def change(program: dict) -> None:
        values = program["graph_module"]["graph"]["tensor_values"]
        first = next(iter(values.values()))
        text = f"__import__('pathlib').Path({str(marker)!r}).touch()"
        first["sizes"][0] = {"as_expr": {"expr_str": text, "hint": None}}

    return change


def _edit_program(src: Path, dst: Path, change: Callable[[dict], None] | None, raw=None) -> None:
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for info in zin.infolist():
            body = zin.read(info)
            if info.filename.endswith("models/model.json"):
                if raw is not None:
                    body = raw
                else:
                    program = json.loads(body)
                    change(program)
                    body = json.dumps(program).encode()
            zout.writestr(info, body)


HOSTILE_FILES = {
    "expression": ("symbolic expression", None),
    "deep json": ("nested too deep", b"[" * 10_000 + b"]" * 10_000),
    "wrong type": ("is not an exported program", b"[1, 2]"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_FILES))
@pytest.mark.parametrize(
    "args",
    [
        ["show", "bad.pt2"],
        ["run", "bad.pt2", "-p", "cse", "-o", "out.pt2"],
        ["diff", "bad.pt2", "tiny.pt2"],
        ["bisect", "bad.pt2", "-p", "cse"],
        ["shard", "bad.pt2", "--tp", "2", "-o", "shards"],
    ],
    ids=["show", "run", "diff", "bisect", "shard"],
)
def test_a_hostile_or_malformed_pt2_is_one_line_in_every_command(
    work: Path, case, args, capsys, monkeypatch
):
    marker = work / "ran"
    text, raw = HOSTILE_FILES[case]
    _edit_program(work / "tiny.pt2", work / "bad.pt2", _hostile_size(marker), raw)
    monkeypatch.chdir(work)
    r = in_process(args, capsys, monkeypatch)
    assert r.code == 3, r
    line = one_line_error(r)
    assert text in line and "models/model.json" in line, line
    assert not marker.exists()
    assert not (work / "out.pt2").exists() and not (work / "shards").exists()
