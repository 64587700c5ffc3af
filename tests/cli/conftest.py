from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path[:0] = [
    str(Path(__file__).resolve().parent),
    str(Path(__file__).resolve().parent.parent / "verify"),
]


@pytest.fixture(scope="session")
def pt2_dir(tmp_path_factory) -> Path:
    """tiny.pt2: the exported (core ATen) 2-layer tiny decoder; tiny.fxgraph: its graph."""
    from fxpass.core.serialize import save_graph
    from fxpass.verify.inputs import program_inputs

    import _models

    folder = tmp_path_factory.mktemp("cli")
    ep = _models.exported()
    torch.export.save(ep, folder / "tiny.pt2")
    inputs = program_inputs(ep, *ep.example_inputs)
    save_graph(_models.exported_gm(remove_asserts=True), folder / "tiny.fxgraph", inputs)
    return folder


@pytest.fixture
def work(pt2_dir: Path, tmp_path: Path) -> Path:
    """A fresh folder with tiny.pt2 and tiny.fxgraph (its graph module, loads fast) in it."""
    for name in ("tiny.pt2", "tiny.fxgraph"):
        (tmp_path / name).write_bytes((pt2_dir / name).read_bytes())
    return tmp_path


@pytest.fixture
def cli(work: Path, capsys, monkeypatch):
    """``cli(*args)``: the fxpass command run in this process in ``work`` — for what a
    separate process adds nothing to (refusals and their messages: each process costs
    seconds of ``import torch``); the rest of the tests run it as users do
    (``_cli_helpers.fxpass``)."""
    from _cli_helpers import in_process

    monkeypatch.chdir(work)
    return lambda *args: in_process(list(args), capsys, monkeypatch)
