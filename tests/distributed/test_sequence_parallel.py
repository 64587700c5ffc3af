"""sequence_parallel: each all-reduce becomes a reduce-scatter over the tokens; the norms run
on this rank's tokens; all-gathers bring them back where all tokens are needed."""

from __future__ import annotations

import pytest
import torch
from _shard_helpers import C10D, assert_vals_consistent, count, sharded

import fxpass as fp
from fxpass.distributed.sequence_parallel import scatter_graph
from fxpass.edit.editor import Editor

aten = torch.ops.aten


def test_norms_run_on_a_share_of_the_tokens():
    tp, sp = sharded(2)[0], sharded(2, sequence_parallel=True)[0]
    assert count(sp.graph_module, C10D.all_reduce.default) == 0
    assert count(sp.graph_module, C10D.reduce_scatter_tensor.default) == count(
        tp.graph_module, C10D.all_reduce.default
    )
    # one gather before each layer's attention and MLP, one before the head, and the logits
    assert count(sp.graph_module, C10D.all_gather_into_tensor.default) == 2 * 2 + 1 + 1
    rsqrts = [n for n in sp.graph.nodes if n.target is aten.rsqrt.default]
    assert rsqrts and all(n.meta["val"].shape == (1, 4, 1) for n in rsqrts)  # 4 of 8 tokens
    assert_vals_consistent(sp)


def test_statistics_and_the_rank_is_needed():
    report = sharded(2, sequence_parallel=True).reports[1]
    assert report.stats()["sequence_parallel.reduce_scatters"] == 5
    gm = torch.fx.symbolic_trace(lambda x: x + 1)
    with pytest.raises(fp.PassFailedError, match="needs world_size and rank"):
        fp.Pipeline.parse("sequence_parallel").run(gm)


def test_a_graph_without_all_reduces_is_left_alone():
    gm = torch.fx.symbolic_trace(lambda x: x + 1)
    assert scatter_graph(gm, 0, 2, Editor(None)) == 0
    assert not fp.Pipeline.parse("sequence_parallel{world_size=2,rank=0}").run(gm).modified


def test_tokens_the_world_size_does_not_divide():
    ep = sharded(2)[0]
    with pytest.raises(fp.PassFailedError, match="cannot split the tokens") as e:
        fp.apply(ep, "sequence_parallel{world_size=3,rank=0}")
    assert "shape [1, 8, 64]" in str(e.value)


def test_inserted_collectives_pass_the_metadata_check():
    from fxpass.verify.invariants import check_metadata

    sp = sharded(2, sequence_parallel=True)[0]
    assert check_metadata(sp.graph_module) == []
    scatters = [n for n in sp.graph.nodes if n.target is C10D.reduce_scatter_tensor.default]
    assert all(n.meta["fxpass_provenance"]["pass"] == "sequence_parallel" for n in scatters)
