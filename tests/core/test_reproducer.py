"""Crash reproducers: written on failure, and their command fails the same way."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest
import torch

import fxpass as fp
from fxpass.core.reproducer import CrashReproducer, load_reproducer, run_reproducer

aten = torch.ops.aten
HERE = Path(__file__).resolve().parent


def drop_asserts(gm):
    for n in list(gm.graph.nodes):
        if n.target is aten._assert_tensor_metadata.default:
            gm.graph.erase_node(n)


def fails_on_rsqrt(gm):
    """Fails when it meets an rsqrt, after editing the graph."""
    for n in gm.graph.nodes:
        if n.target is aten.rsqrt.default:
            n.target = aten.sqrt.default
            raise NotImplementedError(f"cannot lower {n.name}")


def _run_failing(gm, folder, inputs=None):
    pipe = fp.Pipeline([drop_asserts, fp.fixpoint(fails_on_rsqrt)])
    with pytest.raises(fp.PassFailedError) as err:
        pipe.run(gm, inputs, instrument=[CrashReproducer(folder)])
    return err.value


def test_reproducer_folder_holds_input_spec_error_and_command(llama_gm, tmp_path):
    code = llama_gm.code
    err = _run_failing(llama_gm, tmp_path / "repros", [torch.zeros(1, 8, dtype=torch.long)])
    (folder,) = (tmp_path / "repros").iterdir()
    assert folder.name.endswith("fails_on_rsqrt")
    assert {p.name for p in folder.iterdir()} == {
        "input.fxgraph",
        "pipeline.txt",
        "error.txt",
        "README.txt",
    }
    assert "reproduce with:" in str(err) and str(folder) in str(err)
    assert "NotImplementedError: cannot lower rsqrt" in (folder / "error.txt").read_text()
    gm, inputs, pipeline = load_reproducer(folder)
    assert gm.code == code  # the input as the pipeline received it, not as the pass left it
    assert inputs[0].shape == (1, 8)
    assert str(pipeline) == f"{__name__}:drop_asserts,fixpoint({__name__}:fails_on_rsqrt)"


def test_running_the_reproducer_fails_the_same_way(llama_gm, tmp_path):
    err = _run_failing(llama_gm, tmp_path)
    (folder,) = tmp_path.iterdir()
    with pytest.raises(fp.PassFailedError) as again:
        run_reproducer(folder)
    assert again.value.pass_name == err.pass_name == "fails_on_rsqrt"
    assert str(again.value.cause) == str(err.cause)


def test_the_command_in_the_message_reproduces_the_failure(llama_gm, tmp_path):
    err = _run_failing(llama_gm, tmp_path)
    command = str(err).split("reproduce with: ", 1)[1].splitlines()[0]
    proc = subprocess.run(
        shlex.split(command), cwd=HERE, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "pass 'fails_on_rsqrt' failed: NotImplementedError: cannot lower rsqrt" in out


def test_unnamed_passes_are_flagged_in_the_readme(llama_gm, tmp_path):
    def local(gm):
        raise RuntimeError("local failure")

    with pytest.raises(fp.PassFailedError):
        fp.Pipeline([local]).run(llama_gm, instrument=[CrashReproducer(tmp_path)])
    (folder,) = tmp_path.iterdir()
    assert "have no name a spec can use" in (folder / "README.txt").read_text()


def test_a_reproducer_that_cannot_be_written_does_not_hide_the_error(llama_gm, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    err = _run_failing(llama_gm, blocker)
    assert "no reproducer written" in str(err)
    assert err.pass_name == "fails_on_rsqrt"


def test_loading_a_folder_that_is_not_a_reproducer_is_a_clear_error(tmp_path):
    with pytest.raises(fp.FxpassError, match="is not an fxpass reproducer folder"):
        load_reproducer(tmp_path)
