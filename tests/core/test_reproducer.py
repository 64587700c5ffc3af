"""Crash reproducers: written on failure, and their command fails the same way."""

from __future__ import annotations

import copy
import shlex
import subprocess
import sys
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
    assert "have no importable name" in (folder / "README.txt").read_text()


def test_a_reproducer_that_cannot_be_written_does_not_hide_the_error(llama_gm, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    err = _run_failing(llama_gm, blocker)
    assert "no reproducer written" in str(err)
    assert err.pass_name == "fails_on_rsqrt"


def unsaveable(x):
    """A call no graph file can hold (not torch's, operator's, math's or builtins')."""
    return x + 1


torch.fx.wrap("unsaveable")


def _raises(gm):
    raise RuntimeError("the pass failed")


def test_a_reproducer_that_fails_half_way_leaves_no_partial_folder(tmp_path):
    gm = torch.fx.symbolic_trace(lambda x: unsaveable(x) * 2)
    with pytest.raises(fp.PassFailedError) as err:
        fp.Pipeline([_raises]).run(gm, instrument=[CrashReproducer(tmp_path)])
    assert "no reproducer written: GraphFileError: cannot save a call to" in str(err.value)
    assert list(tmp_path.iterdir()) == []


def test_loading_a_folder_that_is_not_a_reproducer_is_a_clear_error(tmp_path):
    with pytest.raises(fp.FxpassError, match="is not an fxpass reproducer folder"):
        load_reproducer(tmp_path)


# ----- user passes of every kind, replayed from a fresh process -------------------------------
KINDS_MODULE = """
import torch
import fxpass as fp
from fxpass.rewrite import traced_rule

aten = torch.ops.aten


@fp.register("repro_kinds_fn")
def fuse_mul_add(gm, *, scale: float = 1.0):
    raise RuntimeError(f"function failed with scale={scale}")


@fp.register("repro_kinds_class")
class Explode(fp.Pass):
    def __init__(self, *, times: int = 1):
        self.times = times

    def call(self, gm):
        raise RuntimeError(f"class failed {self.times} times")


def _refuse(x, y):
    raise RuntimeError("rule set failed")


rule_set = fp.rules("repro_kinds_rules", [(fp.P(aten.mul.Tensor, fp.P.var("x"), fp.P.var("y")), _refuse)])


def _mul(x, y):
    return x * y


def _refuse_traced(x, y):
    raise RuntimeError("traced rule failed")


traced = fp.rules(
    "repro_kinds_traced",
    [traced_rule(_mul, _refuse_traced, [torch.randn(4), torch.randn(4)], trace_replacement=False)],
)


def _inner(gm):
    raise RuntimeError("nested pipeline failed")


nested = fp.Pipeline([fp.fixpoint(_inner)], name="repro_kinds_nested")
"""

REPLAY = """
import sys
import fxpass as fp
from fxpass.core.reproducer import run_reproducer

for folder in sys.argv[1:]:
    try:
        run_reproducer(folder)
        print("no failure")
    except fp.PassFailedError as e:
        print(str(e).splitlines()[0])
"""


def _forget_module(request, name: str) -> None:
    request.addfinalizer(lambda: sys.modules.pop(name, None))


def test_every_kind_of_user_pass_replays_from_a_fresh_process(
    llama_gm, tmp_path, monkeypatch, request
):
    from fxpass.core.pass_registry import REGISTRY

    (tmp_path / "repro_kinds.py").write_text(KINDS_MODULE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(REGISTRY, "_infos", dict(REGISTRY._infos))  # forget its passes after
    _forget_module(request, "repro_kinds")
    import repro_kinds as m

    pipelines = {
        "function": (fp.Pipeline.parse("cse,repro_kinds_fn{scale=2.0}"),
                     "cse,repro_kinds:fuse_mul_add{scale=2.0}"),
        "class": (fp.Pipeline.parse("repro_kinds_class{times=3}"),
                  "repro_kinds:Explode{times=3}"),
        "rule set": (fp.Pipeline([m.rule_set]), "repro_kinds:rule_set"),
        "traced rule": (fp.Pipeline(["dce", m.traced]), "dce,repro_kinds:traced"),
        "nested pipeline": (fp.Pipeline(["cse", m.nested]), "cse,repro_kinds:nested"),
    }  # fmt: skip
    folders, errors = [], []
    for kind, (pipe, spec) in pipelines.items():
        with pytest.raises(fp.PassFailedError) as err:
            pipe.run(copy.deepcopy(llama_gm), instrument=[CrashReproducer(tmp_path / "r" / kind)])
        (folder,) = (tmp_path / "r" / kind).iterdir()
        assert (folder / "pipeline.txt").read_text().strip() == spec, kind
        assert "warning" not in (folder / "README.txt").read_text()
        folders.append(str(folder))
        errors.append(str(err.value).splitlines()[0])
    proc = subprocess.run(
        [sys.executable, "-c", REPLAY, *folders],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == errors
    assert "pass 'repro_kinds_class' failed: RuntimeError: class failed 3 times" in errors


def test_a_reproducer_whose_passes_cannot_be_imported_says_so(
    llama_gm, tmp_path, monkeypatch, request
):
    (tmp_path / "gone_passes.py").write_text("def boom(gm):\n    raise RuntimeError('boom')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    _forget_module(request, "gone_passes")
    import gone_passes

    with pytest.raises(fp.PassFailedError):
        fp.Pipeline([gone_passes.boom]).run(llama_gm, instrument=[CrashReproducer(tmp_path / "r")])
    (folder,) = (tmp_path / "r").iterdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    del sys.modules["gone_passes"]
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(tmp_path)])
    with pytest.raises(fp.FxpassError, match=r"cannot import pass 'gone_passes:boom'.*run it from"):
        run_reproducer(folder)
