"""``async_tp``: all-gather -> matmul and matmul -> reduce-scatter split into chunks, each
collective's output read only after its own wait, the ranks consistent; outputs on gloo
ranks are checked in test_sharded (Llama, the MoE decoder, Olmo3; 2 and 4 ranks)."""

from __future__ import annotations

import pytest
import torch
from _shard_helpers import sharded

import fxpass as fp
from fxpass.distributed.collectives import C10D
from fxpass.distributed.consistency import check_ranks, trace

from _models import exported

WAITED = {C10D.all_gather_into_tensor.default, C10D.reduce_scatter_tensor.default,
          C10D.all_reduce.default}  # fmt: skip


def _waits_before_reads(gm: torch.fx.GraphModule) -> None:
    """Every collective's only reader is its wait_tensor (the happens-before rule)."""
    for node in gm.graph.nodes:
        if node.target in WAITED:
            assert [u.target for u in node.users] == [C10D.wait_tensor.default], node


def test_sequence_parallel_sites_are_chunked():
    shards = sharded(2, sequence_parallel=True)
    result = fp.apply(shards[0], "async_tp{chunks=2}")
    stats = result.report.stats()
    # q/k/v and gate/up read 2 gathers a layer, and the head one; o/down feed reduce-scatters
    assert stats["async_tp.all_gather_matmul"] == 5
    assert stats["async_tp.matmul_reduce_scatter"] == 4
    calls = trace(result.program)[0]
    kinds = [c.kind for c in calls]
    assert kinds.count("reduce_scatter") == 1 + 4 * 2 and kinds.count("all_gather") == 1 + 5 * 2
    gathers = [c for c in calls if c.kind == "all_gather" and c.shape[0] == 2]
    assert gathers, "each chunk gathers half of this rank's 4 tokens"
    _waits_before_reads(result.program.graph_module)
    other = fp.apply(shards[1], "async_tp{chunks=2}").program
    assert check_ranks([result.program, other], shards.mesh) == []


def test_chunks_the_tokens_do_not_divide_leave_the_site_alone():
    shards = sharded(2, sequence_parallel=True)  # 8 tokens, 2 ranks: 4 chunks of 1 fit,
    result = fp.apply(shards[0], "async_tp{chunks=8}")  # 8 do not
    assert not result.report.modified


def test_without_sequence_parallel_there_is_nothing_to_overlap():
    shards = fp.shard(exported(dtype=torch.float32), 2, async_tp=2)
    (entry,) = shards.plan.applied
    assert entry["option"] == "async_tp" and not entry["applied"]
    assert entry["why"].startswith("found nothing to change")


def test_gated_by_token_count():
    program = exported(dtype=torch.float32)
    on = fp.shard(program, 2, sequence_parallel=True, async_tp=2, gates={"async_tp": (1, 8)})
    off = fp.shard(program, 2, sequence_parallel=True, async_tp=2, gates={"async_tp": "16.."})
    assert {a["option"]: a["applied"] for a in on.plan.applied} == {
        "sequence_parallel": True, "async_tp": True}  # fmt: skip
    entry = {a["option"]: a for a in off.plan.applied}["async_tp"]
    assert not entry["applied"] and "tokens:16.." in entry["why"] and "8" in entry["why"]
    assert off.plan.gates == {"async_tp": [16, None]}
    assert off.plan.to_dict()["gates"] == {"async_tp": [16, None]}
    with pytest.raises(fp.distributed.ShardError, match="no option 'overlap' to gate"):
        fp.shard(program, 2, gates={"overlap": (1, 2)})
    with pytest.raises(fp.PassFailedError, match="chunks must be at least 2"):
        fp.apply(on[0], "async_tp{chunks=1}")
