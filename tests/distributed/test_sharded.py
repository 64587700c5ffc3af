"""Every rank's program computes what the original computed: 2 (and 4) gloo processes on
127.0.0.1 load their .pt2 file and run it, for the embedded decoder and every tiny Hugging
Face family, with and without sequence parallelism and the collective fusion.

One spawn per world size runs every case (spawning costs seconds); programs are sharded
and saved here, in the test process, and each rank only loads and runs its own.
"""

from __future__ import annotations

import hashlib
import json

import pytest
import torch

import fxpass as fp
from fxpass.distributed import ShardError, load_rank

from _models import decoder, exported

_hf = pytest.importorskip("_hf")
from _rank_cases import logits, run_cases  # noqa: E402
from _spawn import run  # noqa: E402

TOL = 2e-5  # fp32; the ranks' partial sums are added in another order than one matmul's
CONFIGS = {
    "tp": {},
    "tp+fuse": {"fuse": True},
    "sp": {"sequence_parallel": True},
    "sp+fuse": {"sequence_parallel": True, "fuse": True},
}


def _model(name: str, world_size: int):
    """(exported program, inputs, is_hf) of ``name``: the embedded decoder or a family."""
    if name == "decoder":  # 4 heads, 4 KV heads
        return exported(dtype=torch.float32), decoder(dtype=torch.float32).example_inputs(), False
    extra = {"num_key_value_heads": 4} if world_size == 4 else {}
    return _hf.exported(name, **extra), _hf.example_inputs(), True


def _cases(tmp, world_size: int, names, configs) -> list[dict]:
    cases = []
    for name in names:
        ep, inputs, hf = _model(name, world_size)
        torch.save(inputs, tmp / f"{name}.inputs.pt")
        torch.save(_logits(ep.module()(*inputs)), tmp / f"{name}.expected.pt")
        for config in configs:
            d = tmp / f"{name}-{config}"
            fp.shard(ep, world_size, **CONFIGS[config]).save(d)
            cases.append(
                {
                    "name": f"{name}-{config}",
                    "dir": str(d),
                    "inputs": str(tmp / f"{name}.inputs.pt"),
                    "expected": str(tmp / f"{name}.expected.pt"),
                    "hf": hf,
                }
            )
    return cases


def _logits(out):
    return logits(out).detach()


#: model -> configurations. The embedded decoder with and without sequence parallelism and
#: the fusion, and both; Llama and Qwen3 with each; every other family (fused projections,
#: biases, other head widths, soft caps, windows, sandwich norms, experts: the tests do not
#: say which) with sequence parallelism, which runs the tensor-parallel rewrite first. Each
#: case costs a save here and a load in each rank: the list is what adds coverage.
FULL = ("llama", "qwen3")
WORLD2 = (
    {"decoder": list(CONFIGS)}
    | {n: ["tp", "tp+fuse", "sp"] for n in FULL}
    | {f: ["sp"] for f in sorted(_hf.FAMILIES) if f not in FULL}
)
#: 4 ranks: the decoder has 4 KV heads; the Hugging Face configs have 2, which cannot be
#: split across 4 ranks (see test_kv_heads_fewer_than_ranks_are_refused)
WORLD4 = {"decoder": ["tp", "sp+fuse"]}


#: inside torch.compile: the passes take the rank from torch.distributed, Inductor compiles
#: the collectives and the fused op (one compilation: they are the slowest cases here)
COMPILED = {
    "name": "compiled",
    "kind": "backend",
    "pipeline": "tensor_parallel,remove_assert_ops,fuse_allreduce_add_rmsnorm",
    "compiler": "inductor",
}


def _world(tmp_path_factory, world_size: int, plan: dict, extra=()) -> list:
    tmp = tmp_path_factory.mktemp(f"world{world_size}")
    cases = [c for name, configs in plan.items() for c in _cases(tmp, world_size, [name], configs)]
    return run(run_cases, world_size, [*cases, *extra], timeout=600)


@pytest.fixture(scope="module")
def world2(tmp_path_factory):
    return _world(tmp_path_factory, 2, WORLD2, [COMPILED])


@pytest.fixture(scope="module")
def world4(tmp_path_factory):
    return _world(tmp_path_factory, 4, WORLD4)


@pytest.mark.parametrize("name, config", [(n, c) for n, cs in WORLD2.items() for c in cs])
def test_two_ranks_compute_the_original(world2, name, config):
    for rank, results in enumerate(world2):
        r = results[f"{name}-{config}"]
        assert r["err"] < TOL, f"rank {rank}: max error {r['err']}"


@pytest.mark.parametrize("name, config", [(n, c) for n, cs in WORLD4.items() for c in cs])
def test_four_ranks_compute_the_original(world4, name, config):
    for rank, results in enumerate(world4):
        assert results[f"{name}-{config}"]["err"] < TOL, f"rank {rank}"


def test_passes_inside_torch_compile_know_their_rank(world2):
    for rank, results in enumerate(world2):
        r = results["compiled"]
        assert r["err"] < TOL, f"rank {rank}"
        assert r["stats"]["tensor_parallel.sharded_weights"] == 9  # 7 linears, embedding, head
        assert r["stats"]["fuse_allreduce_add_rmsnorm.rewrites"] == 2  # after attention, MLP


def test_every_family_is_run():
    assert set(WORLD2) == {"decoder", *_hf.FAMILIES}


# ----- in this process: files, manifest, loading -------------------------------------------
def test_save_writes_each_rank_and_a_manifest(tmp_path):
    from _shard_helpers import sharded

    shards = sharded(2)
    manifest = json.loads(shards.save(tmp_path).read_text())
    assert manifest["world_size"] == 2 and manifest["plan"] == shards.plan.to_dict()
    for rank, entry in enumerate(manifest["files"]):
        data = (tmp_path / entry["file"]).read_bytes()
        assert entry["file"] == f"rank{rank}.pt2" and entry["bytes"] == len(data)
        assert entry["sha256"] == hashlib.sha256(data).hexdigest()
        assert entry["weight_bytes"] * 2 < manifest["unsharded_weight_bytes"] * 1.02
    loaded = load_rank(tmp_path, 1)
    assert torch.equal(loaded.state_dict["lm_head.weight"], shards[1].state_dict["lm_head.weight"])


def test_load_rank_checks_what_it_loads(tmp_path):
    from _shard_helpers import sharded

    sharded(2).save(tmp_path)
    with pytest.raises(ShardError, match="needs a rank"):
        load_rank(tmp_path)  # no process group in this process
    with pytest.raises(ShardError, match="has no program for rank 2"):
        load_rank(tmp_path, 2)
    path = tmp_path / "rank0.pt2"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(ShardError, match="does not match its checksum"):
        load_rank(tmp_path, 0)
    with pytest.raises(ShardError, match="cannot read"):
        load_rank(tmp_path / "nowhere", 0)
