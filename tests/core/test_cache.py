"""Cached pipelines: a second run restores the result without running the passes, says so,
and never trusts an entry that is damaged, stale or stored under another key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import fxpass as fp
from fxpass.core.cache import PipelineCache

from _models import exported_gm

RUNS: list[str] = []


def counted(gm: torch.fx.GraphModule) -> bool:
    """Changes nothing; counts that it ran."""
    RUNS.append("counted")
    return False


SPEC = "remove_assert_ops,fuse_add_rmsnorm,test_cache:counted,cse,dce"


@pytest.fixture
def fresh():
    RUNS.clear()
    return lambda: exported_gm()


def _entries(folder: Path, suffix: str) -> list[Path]:
    return sorted(folder.glob(f"*{suffix}"))


def test_second_run_restores_the_result_without_the_passes(fresh, tmp_path):
    first_gm, again_gm = fresh(), fresh()
    first = fp.apply(first_gm, SPEC, cache=tmp_path)
    assert RUNS == ["counted"] and first.report.cached == ""
    again = fp.apply(again_gm, SPEC, cache=tmp_path)
    assert RUNS == ["counted"], "the passes did not run again"
    assert again.program is again_gm and again.modified  # in place, as a run
    assert "fxpass cache" in again.report.cached and "cached: the passes did not run" in str(
        again.report
    )
    assert [r.to_dict() for r in again.report.passes] == [r.to_dict() for r in first.report.passes]
    assert str(again_gm.graph) == str(first_gm.graph)
    for a, b in zip(again_gm.graph.nodes, first_gm.graph.nodes):  # fake values restored
        va, vb = a.meta.get("val"), b.meta.get("val")
        if isinstance(vb, torch.Tensor):
            assert isinstance(va, torch.Tensor) and (va.shape, va.stride()) == (
                vb.shape,
                vb.stride(),
            )
    torch.testing.assert_close(again_gm(*_inputs(again_gm)), first_gm(*_inputs(first_gm)))


def test_damaged_or_stale_entries_are_ignored_and_replaced(fresh, tmp_path):
    fp.apply(fresh(), SPEC, cache=tmp_path)
    (graph_file,) = _entries(tmp_path, ".fxgraph")
    (meta_file,) = _entries(tmp_path, ".json")
    data = bytearray(graph_file.read_bytes())
    data[len(data) // 2] ^= 0xFF
    graph_file.write_bytes(bytes(data))
    result = fp.apply(fresh(), SPEC, cache=tmp_path)
    assert result.report.cached == "" and RUNS == ["counted"] * 2
    assert any("fails its checksum" in n for n in result.report.root.notes)
    assert fp.apply(fresh(), SPEC, cache=tmp_path).report.cached  # rewritten: good again

    head, _, body = meta_file.read_bytes().partition(b"\n")
    meta = json.loads(body)
    meta["torch"] = "1.0.0"  # a stale entry with a valid checksum
    _rewrite(meta_file, meta)
    stale = fp.apply(fresh(), SPEC, cache=tmp_path)
    assert stale.report.cached == "" and any(
        "written by torch 1.0.0" in n for n in stale.report.root.notes
    )

    meta_file.write_bytes(head + b"\n" + body.replace(b'"modified": true', b'"modified": false'))
    tampered = fp.apply(fresh(), SPEC, cache=tmp_path)
    assert tampered.report.cached == "" and any("checksum" in n for n in tampered.report.root.notes)


def test_the_key_follows_the_pipeline_and_the_graph(fresh, tmp_path):
    cache = PipelineCache(tmp_path)
    fp.apply(fresh(), SPEC, cache=cache)
    assert fp.apply(fresh(), SPEC + ",cse", cache=cache).report.cached == ""
    other = exported_gm(remove_asserts=True)
    assert fp.apply(other, SPEC, cache=cache).report.cached == ""
    assert cache.hits == 0 and cache.misses == 3
    graphs = len(_entries(tmp_path, ".fxgraph"))
    unchanged = fp.apply(exported_gm(), "test_cache:counted", cache=cache)
    assert not unchanged.modified and len(_entries(tmp_path, ".fxgraph")) == graphs  # no graph kept
    again = fp.apply(exported_gm(), "test_cache:counted", cache=cache)
    assert again.report.cached and not again.modified and cache.hits == 1
    with pytest.raises(NotADirectoryError):
        PipelineCache(tmp_path / (_entries(tmp_path, ".json")[0].name))


def test_a_bisection_run_never_uses_the_cache(fresh, tmp_path):
    fp.apply(fresh(), SPEC, cache=tmp_path)
    result = fp.apply(fresh(), SPEC, cache=tmp_path, debug_counter=fp.DebugCounter(count=1))
    assert result.report.cached == "" and RUNS == ["counted"] * 2


def _rewrite(path: Path, data: dict) -> None:
    import hashlib

    body = json.dumps(data, sort_keys=True).encode()
    path.write_bytes(b"sha256:" + hashlib.sha256(body).hexdigest().encode() + b"\n" + body)


def _inputs(gm: torch.fx.GraphModule) -> list[torch.Tensor]:
    from fxpass.verify.inputs import sample_inputs_from_meta

    torch.manual_seed(0)
    return sample_inputs_from_meta(gm)
