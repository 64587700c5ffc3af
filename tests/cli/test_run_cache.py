"""`fxpass run --cache DIR`: a second run restores the result without the passes and says
"cached"; an edited pass invalidates the entry."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from _cli_helpers import fxpass

_PASS = '''
import torch


def neg_free(gm):
    """Counts its runs in runs.txt; changes nothing."""
    with open("runs.txt", "a") as f:
        f.write("{mark}\\n")
    return False
'''


def _run(work: Path, *extra: str):
    r = fxpass("run", "tiny.pt2", "-p", "cse,my_cache_passes:neg_free,dce", "--cache", "c",
               "-o", "out.pt2", *extra, cwd=work)  # fmt: skip
    assert r.code == 0, r.err
    return json.loads(r.out)["report"] if extra else r.out


def test_second_run_is_cached_and_an_edited_pass_runs_again(work: Path):
    passes = work / "my_cache_passes.py"
    passes.write_text(_PASS.format(mark="v1"))
    first = _run(work, "--json")
    assert first["cached"] == "" and first["modified"]
    first_out = torch.export.load(work / "out.pt2")
    second = _run(work)
    assert "cached: the passes did not run; the result came from the fxpass cache c" in second
    assert "merged=" in second  # the report recorded when the passes ran
    assert (work / "runs.txt").read_text().split() == ["v1"], "the passes did not run again"
    assert str(torch.export.load(work / "out.pt2").graph) == str(first_out.graph)
    passes.write_text(_PASS.format(mark="v2"))  # an edited pass
    assert _run(work, "--json")["cached"] == ""
    assert (work / "runs.txt").read_text().split() == ["v1", "v2"]
