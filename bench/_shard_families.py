"""bench/shard.py's second table: families and meshes, against 1/N and the minimum, and
PyTorch's own pipelining on the eager model in the same run.

For each (family, mesh) the program is sharded with no plan (or the mesh given), saved, and
each gloo rank loads its ``.pt2`` (or its pipeline stage) and runs it, counting the
collectives a forward issues and the bytes they reduce or gather, and the bytes of its
weights by storage. The strategy's minimum is two all-reduces of the hidden state per
layer of the rank's stage (attention and MLP or experts, each combined once). For
pipeline meshes the same decoder is also split by ``torch.distributed.pipelining.pipeline``
(``split_spec`` at the middle layer) and run under ``ScheduleGPipe``: weights per stage,
activation bytes per token between stages, and the error, side by side with fxpass's stages.
"""

from __future__ import annotations

import os
import pickle
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

import fxpass as fp
from fxpass.distributed import load_rank, load_stage, weight_bytes
from fxpass.models.llama import build_decoder

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

TIMEOUT = 900
MICRO = 2  # microbatches (of the captured batch of 1) under a pipelining schedule


def _program(family: str, world_size: int) -> tuple[Any, tuple, int, int]:
    """(exported program, inputs, layers, hidden) of the embedded decoder or a tiny HF family."""
    if family.startswith("decoder"):
        cfg = {"dtype": torch.float32, "moe_experts": 4 if family == "decoder_moe" else 0}
        model = build_decoder(layers=2, kv_heads=4, **cfg)
        inputs = model.example_inputs()
        return torch.export.export(model, inputs), inputs, 2, model.cfg.hidden
    import _hf

    extra = {"num_key_value_heads": 4} if world_size == 4 else {}
    return _hf.exported(family, **extra), _hf.example_inputs(), 2, 64


def _logits(out: Any) -> torch.Tensor:
    out = out[0] if isinstance(out, (tuple, list)) else out
    return getattr(out, "logits", out).detach()


def prepare(family: str, mesh: dict, tmp: Path) -> dict[str, Any]:
    world_size = mesh.get("world_size") or fp.distributed.Mesh(**mesh).world_size
    ep, inputs, layers, hidden = _program(family, world_size)
    pp = mesh.get("pp", 1)
    if pp > 1:
        (ids,) = inputs
        inputs = (torch.cat([ids.roll(i, -1) for i in range(MICRO)]),)
        expected = torch.cat([_logits(ep.module()(row[None])) for row in inputs[0]])
    else:
        expected = _logits(ep.module()(*inputs))
    shards = fp.shard(ep, **mesh)
    d = tmp / f"{family}-{'-'.join(f'{k}{v}' for k, v in mesh.items())}"
    shards.save(d)
    torch.save((inputs, expected), d / "io.pt")
    nodes = {n.name: n for n in ep.graph.nodes}
    sends = shards.plan.stages[0].sends if pp > 1 else []
    crossing = sum(nodes[name].meta["val"].numel() for name in sends) * MICRO
    tokens = inputs[0].numel()  # every microbatch's
    return {
        "family": family,
        "mesh": str(shards.mesh),
        "world_size": shards.world_size,
        "job": {"dir": str(d), "pp": pp, "family": family},
        "unsharded": weight_bytes(ep),
        "minimum": 2 * (layers // pp) * hidden * 4 if shards.mesh.stage_size > 1 else 0,
        "tokens": tokens,
        "sends_per_token": crossing * 4 / tokens,
        "hf": not family.startswith("decoder"),
    }


# ----- on each rank ------------------------------------------------------------------------
def _torch_pipeline(rank: int, ids: torch.Tensor, expected: torch.Tensor) -> dict[str, Any]:
    """The eager decoder split by torch.distributed.pipelining at its middle layer."""
    from torch.distributed.pipelining import ScheduleGPipe, SplitPoint, pipeline

    model = build_decoder(layers=2, kv_heads=4, dtype=torch.float32)
    pipe = pipeline(model, mb_args=(ids[:1],), split_spec={"layers.1": SplitPoint.BEGINNING})
    stage = pipe.build_stage(rank, torch.device("cpu"))
    schedule = ScheduleGPipe(stage, n_microbatches=ids.shape[0])
    with torch.no_grad():
        out = schedule.step(ids) if rank == 0 else schedule.step()
    err = (_logits(out) - expected).abs().max().item() if rank == pipe.num_stages - 1 else 0.0
    return {"err": err, "bytes": weight_bytes(stage.submod)}


def rank_jobs(rank: int, jobs: list[dict], out_dir: str) -> None:
    import torch.distributed as dist
    from shard import CommBytes
    from torch.distributed.pipelining import ScheduleGPipe

    results = {}
    if any(j.get("hf") for j in jobs):
        import transformers.integrations.moe
        import transformers.modeling_outputs  # noqa: F401
    for job in jobs:
        (inputs, expected) = torch.load(Path(job["dir"], "io.pt"))
        stage = load_stage(job["dir"]) if job["pp"] > 1 else None
        if stage is not None:  # a first step infers the stages' shapes: not counted
            schedule = ScheduleGPipe(stage, n_microbatches=inputs[0].shape[0])
            with torch.no_grad():
                schedule.step(*inputs) if stage.is_first else schedule.step()
        with CommBytes() as comm, torch.no_grad():
            if stage is not None:
                out = schedule.step(*inputs) if stage.is_first else schedule.step()
                last = stage.is_last
                nbytes = weight_bytes(stage.submod)
            else:
                program = load_rank(job["dir"])
                out, last, nbytes = program.module()(*inputs), True, weight_bytes(program)
        err = (_logits(out) - expected).abs().max().item() if last else float("nan")
        result = {"err": err, "bytes": nbytes, "calls": comm.calls, "comm": comm.bytes}
        if job["pp"] > 1 and dist.get_world_size() == job["pp"] and job["family"] == "decoder":
            result["torch"] = _torch_pipeline(rank, inputs[0], expected)
        results[job["dir"]] = result
    Path(out_dir, f"rank{rank}.pkl").write_bytes(pickle.dumps(results))


def _rank_main(rank, world_size, port, jobs, out_dir):
    import datetime

    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=TIMEOUT))  # fmt: skip
    try:
        rank_jobs(rank, jobs, out_dir)
    finally:
        dist.destroy_process_group()


def run(cases: list[tuple[str, dict]]) -> list[tuple[dict, list[dict]]]:
    """Prepare every case here, run them on their world sizes (one spawn per size)."""
    from shard import run_ranks

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        prepared = [prepare(f, mesh, Path(tmp)) for f, mesh in cases]
        for size in sorted({p["world_size"] for p in prepared}):
            mine = [p for p in prepared if p["world_size"] == size]
            jobs = [{**p["job"], "hf": p["hf"]} for p in mine]
            ranks = run_ranks(size, jobs, target=_rank_main)
            rows += [(p, [r[p["job"]["dir"]] for r in ranks]) for p in mine]
    return rows


def show(rows: list[tuple[dict, list[dict]]]) -> None:
    print(
        f"\n{'family':>12} {'mesh':>16} {'ranks':>5} {'max weights':>11} {'1/N':>6} "
        f"{'collectives':>24} {'bytes/token':>11} {'minimum':>8} {'ratio':>6} "
        f"{'sends/token':>11} {'max|diff|':>9}"
    )
    for p, ranks in rows:
        n = p["world_size"]
        share = max(r["bytes"] for r in ranks) / p["unsharded"]
        r0 = ranks[0]
        names = {"all_gather_into_tensor": "all_gather", "reduce_scatter_tensor": "reduce_scatter"}
        calls = ", ".join(f"{v} {names.get(k, k)}" for k, v in sorted(r0["calls"].items()))
        per_token = r0["comm"] / p["tokens"]
        ratio = f"{per_token / p['minimum']:.2f}" if p["minimum"] else "-"
        err = max(r["err"] for r in ranks if r["err"] == r["err"])
        print(
            f"{p['family']:>12} {p['mesh']:>16} {n:>5} {share:>11.1%} {1 / n:>6.1%} "
            f"{calls or '-':>24} {per_token:>11,.0f} {p['minimum']:>8,} {ratio:>6} "
            f"{p['sends_per_token']:>11,.0f} {err:>9.1e}"
        )
        if "torch" in r0:
            theirs = [r["torch"] for r in ranks]
            print(
                f"{'':>12} {'torch pipeline()':>16} {n:>5} "
                f"{max(t['bytes'] for t in theirs) / p['unsharded']:>11.1%} {1 / n:>6.1%} "
                f"{'-':>24} {0:>11,} {'':>8} {'':>6} {'(its own)':>11} "
                f"{max(t['err'] for t in theirs):>9.1e}"
            )
    print(
        "max weights: the largest rank's weights by storage after save/load; bytes/token: "
        "the tensors its collectives reduce or gather per forward; minimum: two all-reduces "
        "of the hidden state per layer of a stage (ratio above 1: the embedding's all-reduce "
        "and the logits' all-gather); sends/token: the activation a pipeline stage sends."
    )
