"""fuse_allreduce_add_rmsnorm: all-reduce + residual add + RMSNorm -> one op (numerics on
real ranks: tests/distributed/test_sharded.py)."""

from __future__ import annotations

import pytest
import torch
from _shard_helpers import C10D, assert_vals_consistent, count, sharded

import fxpass as fp

FUSED = torch.ops.fxpass.all_reduce_add_rmsnorm.default


def test_every_layer_end_is_fused():
    program = sharded(2, fuse=True)[0]
    gm = program.graph_module
    assert count(gm, FUSED) == 4  # after attention and after the MLP, 2 layers
    assert count(gm, C10D.all_reduce.default) == 1  # the embedding's feeds a norm, no add
    node = next(n for n in gm.graph.nodes if n.target is FUSED)
    assert node.args[-1] == "0" and node.args[3] == 1e-6  # the group and eps travel with it
    assert_vals_consistent(program)


def test_after_fuse_add_rmsnorm_too():
    program = sharded(2)[0]
    result = fp.apply(program, "fuse_add_rmsnorm,fuse_allreduce_add_rmsnorm")
    gm = result.program.graph_module
    assert count(gm, FUSED) == 4
    assert count(gm, torch.ops.fxpass.fused_add_rmsnorm.default) == 0
    assert result.report.stats()["fuse_allreduce_add_rmsnorm.rewrites"] == 4


def test_nothing_to_fuse_under_sequence_parallelism():
    program = sharded(2, sequence_parallel=True)[0]
    assert not fp.apply(program, "fuse_allreduce_add_rmsnorm").modified


def test_fusing_nothing_says_why():
    _hf = pytest.importorskip("_hf")
    shards = fp.shard(_hf.exported("olmo3"), 2, fuse=True)  # its norms follow the blocks
    assert "--fuse fused no site: no sum all-reduce feeds a residual add" in str(shards)
