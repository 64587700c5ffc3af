"""Sharding: fxpass.shard on captured programs against DTensor and pipelining on the models.

For 2 and 4 ranks and decoders of 4, 16 and 64 layers (fp32, hidden 64, 4 heads, 4 KV
heads, vocab 128, 8 tokens) this prints

* the time to plan (``analyze``) and to rewrite (``shard``, per rank) the exported program,
  and DTensor's ``parallelize_module`` time on the eager model;
* collectives per forward and bytes communicated per token, against the minimum for plain
  tensor parallelism — two all-reduces of the hidden state per layer — and against DTensor
  with the equivalent plan (q/k/v, gate/up ``ColwiseParallel``; o/down ``RowwiseParallel``;
  the embedding ``RowwiseParallel``, the head ``ColwiseParallel`` with replicated output),
  measured in the same run on gloo ranks (127.0.0.1) by counting the functional
  collectives each forward issues;
* the largest difference of each rank's logits from the single-process model's, for
  fxpass's rank programs (saved and loaded as .pt2) and for DTensor.

DTensor needs the model's source: its attention reads head counts from the module, so the
plan also has to rewrite them (``heads // world_size``) by hand; fxpass reads them from the
graph.

A second table (:mod:`_shard_families`) shards tiny Hugging Face families (Olmo3, Glm4,
GptOss, Qwen3-MoE, Mixtral) and the embedded decoder with and without experts on 2 and 4
ranks, over tp x ep and with pipeline stages, with no plan: the largest rank's weights
against 1/N, the collectives and bytes per token against the strategy's minimum, the
error — and, for pipeline stages, ``torch.distributed.pipelining.pipeline`` on the eager
model in the same run.

A third table (:mod:`_shard_comm`) prints, per strategy (TP, SP, SP + async TP, EP), the
collectives and bytes per layer against the strategy's minimum, the extra collectives and
why, and the launches per forward without and with bucketing.

    python bench/shard.py            # 2 and 4 ranks; 4, 16, 64 layers; every family and mesh
    python bench/shard.py --quick    # 2 ranks, 2 layers, Mixtral, 2 stages (a smoke test)
"""

from __future__ import annotations

import datetime
import os
import pickle
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from _common import parser, timeit
from _ranks import TIMEOUT, CommBytes, run_ranks

import fxpass as fp
from fxpass.distributed import analyze
from fxpass.models.llama import build_decoder

CONFIG = {"dtype": torch.float32}


# ----- on each rank ------------------------------------------------------------------------------
def _dtensor_model(layers: int, world_size: int) -> tuple[torch.nn.Module, float]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    model = build_decoder(layers=layers, **CONFIG)
    mesh = init_device_mesh("cpu", (world_size,))
    plan: dict[str, Any] = {
        "embed_tokens": RowwiseParallel(input_layouts=Replicate()),
        "lm_head": ColwiseParallel(output_layouts=Replicate()),
    }
    for i in range(layers):
        for name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj",
                     "mlp.up_proj"):  # fmt: skip
            plan[f"layers.{i}.{name}"] = ColwiseParallel()
        plan[f"layers.{i}.self_attn.o_proj"] = RowwiseParallel()
        plan[f"layers.{i}.mlp.down_proj"] = RowwiseParallel()
    t0 = time.perf_counter()
    parallelize_module(model, mesh, plan)
    cfg = model.cfg
    local = cfg.replace(heads=cfg.heads // world_size, kv_heads=cfg.kv_heads // world_size,
                        head_size=cfg.head_dim)  # fmt: skip
    for layer in model.layers:  # the head counts the module reads: by hand
        layer.self_attn.cfg = local
    return model, time.perf_counter() - t0


def _forward(fn, ids) -> tuple[torch.Tensor, CommBytes, float]:
    with torch.no_grad():
        fn(ids)  # warm up
        with CommBytes() as comm:
            out = fn(ids)
        t = timeit(lambda: fn(ids), repeat=3)
    return out, comm, t


def rank_main(rank: int, world_size: int, port: int, jobs: list[dict], out_dir: str) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size))  # fmt: skip
    dist.init_process_group("gloo", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=TIMEOUT))  # fmt: skip
    results = {}
    try:
        for job in jobs:
            ids, expected = torch.load(job["inputs"])
            program = fp.distributed.load_rank(job["dir"]).module()
            ours, ours_comm, ours_t = _forward(program, ids)
            model, t_par = _dtensor_model(job["layers"], world_size)
            theirs, theirs_comm, theirs_t = _forward(model, ids)
            results[job["layers"]] = {
                "ours_err": (ours - expected).abs().max().item(),
                "dt_err": (theirs - expected).abs().max().item(),
                "ours_calls": ours_comm.calls,
                "dt_calls": theirs_comm.calls,
                "ours_bytes": ours_comm.bytes,
                "dt_bytes": theirs_comm.bytes,
                "ours_fwd": ours_t,
                "dt_fwd": theirs_t,
                "dt_parallelize": t_par,
            }
    finally:
        dist.destroy_process_group()
    Path(out_dir, f"rank{rank}.pkl").write_bytes(pickle.dumps(results))


# ----- here --------------------------------------------------------------------------------------
def _prepare(world_size: int, layers: int, tmp: Path, repeat: int) -> dict[str, Any]:
    model = build_decoder(layers=layers, **CONFIG)
    (ids,) = model.example_inputs()
    ep = torch.export.export(model, (ids,))
    t_plan = timeit(lambda: analyze(ep, world_size), repeat=repeat)
    plan = analyze(ep, world_size)
    t0 = time.perf_counter()
    shards = fp.shard(ep, world_size, plan=plan)
    t_rewrite = (time.perf_counter() - t0) / world_size
    d = tmp / f"{world_size}-{layers}"
    shards.save(d)
    torch.save((ids, model(ids).detach()), d / "inputs.pt")
    tokens = ids.numel()
    hidden = model.cfg.hidden * 4  # fp32 bytes
    return {
        "job": {"layers": layers, "dir": str(d), "inputs": str(d / "inputs.pt")},
        "nodes": len(ep.graph.nodes),
        "plan_ms": t_plan * 1e3,
        "rewrite_ms": t_rewrite * 1e3,
        "collectives": len(plan.collectives),
        "static_bytes": sum(c["bytes"] for c in plan.collectives) / tokens,
        "minimum": 2 * layers * hidden,
        "tokens": tokens,
        "share": shards.rank_bytes(0) / shards.unsharded_bytes,
    }


def main(argv=None) -> int:
    p = parser(__doc__.splitlines()[0])
    args = p.parse_args(argv)
    worlds = [2] if args.quick else [2, 4]
    layer_counts = [2] if args.quick else [4, 16, 64]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for world_size in worlds:
            prepared = [_prepare(world_size, n, Path(tmp), args.repeat) for n in layer_counts]
            ranks = run_ranks(world_size, [x["job"] for x in prepared], rank_main)
            for x in prepared:
                n = x["job"]["layers"]
                per_rank = [r[n] for r in ranks]
                rows.append((world_size, n, x, per_rank))
    _print(rows)
    import _shard_families

    _shard_families.show(_shard_families.run(QUICK_CASES if args.quick else CASES))
    import _shard_comm

    _shard_comm.show(args.quick)
    return 0


MOE = ("gpt_oss", "qwen3_moe", "mixtral")
CASES = (
    [(f, {"world_size": n}) for n in (2, 4) for f in ("olmo3", "glm4", *MOE, "decoder_moe")]
    + [(f, {"tp": 2, "ep": 2}) for f in MOE]
    + [("decoder", {"pp": 2}), ("decoder_moe", {"pp": 2}), ("decoder", {"tp": 2, "pp": 2})]
)
QUICK_CASES = [("mixtral", {"world_size": 2}), ("decoder", {"pp": 2})]


def _print(rows) -> None:
    print(
        f"{'ranks':>5} {'layers':>6} {'nodes':>6} {'plan ms':>8} {'rewrite ms/rank':>15} "
        f"{'DTensor ms':>10} {'collectives':>12} {'bytes/token':>12} {'DTensor':>8} "
        f"{'TP minimum':>10} {'ratio to min':>12} {'weights/rank':>12} {'max|diff|':>9} "
        f"{'DTensor':>8}"
    )
    worst = 0.0
    for world_size, n, x, per_rank in rows:
        r0 = per_rank[0]
        ours_per_token = r0["ours_bytes"] / x["tokens"]
        dt_per_token = r0["dt_bytes"] / x["tokens"]
        ours_calls = sum(r0["ours_calls"].values())
        dt_calls = sum(r0["dt_calls"].values())
        err = max(r["ours_err"] for r in per_rank)
        dt_err = max(r["dt_err"] for r in per_rank)
        worst = max(worst, err)
        print(
            f"{world_size:>5} {n:>6} {x['nodes']:>6} {x['plan_ms']:>8.1f} "
            f"{x['rewrite_ms']:>15.1f} {r0['dt_parallelize'] * 1e3:>10.1f} "
            f"{ours_calls:>5} / {dt_calls:<4} {ours_per_token:>12,.0f} {dt_per_token:>8,.0f} "
            f"{x['minimum']:>10,} {ours_per_token / x['minimum']:>12.2f} {x['share']:>12.1%} "
            f"{err:>9.1e} {dt_err:>8.1e}"
        )
        assert ours_per_token == x["static_bytes"], "measured bytes differ from the plan's"
    print(
        "bytes/token: the full tensors reduced or gathered per forward, per token; the TP "
        "minimum is two all-reduces of the hidden state per layer (fxpass and DTensor add the "
        "embedding's all-reduce and the logits' all-gather)."
    )
    print(f"ratio of fxpass's bytes to DTensor's: {_ratio(rows):.2f}; worst max|diff| {worst:.1e}")


def _ratio(rows) -> float:
    ours = sum(per_rank[0]["ours_bytes"] for *_, per_rank in rows)
    theirs = sum(per_rank[0]["dt_bytes"] for *_, per_rank in rows)
    return ours / theirs if theirs else float("nan")


if __name__ == "__main__":
    sys.exit(main())
