"""Tensor parallelism from a captured program: shard it per rank, run each rank with torchrun.

    python examples/tensor_parallel.py
        exports the tiny decoder, shards it for 2 ranks (rank0.pt2, rank1.pt2,
        manifest.json), then launches 2 processes with torchrun on gloo (CPU)

    torchrun --nproc-per-node 2 examples/tensor_parallel.py DIR
        what each launched process runs: load this rank's program from DIR and run it

On GPUs, use the "nccl" backend and move the inputs to the rank's device.
"""

from __future__ import annotations

import datetime
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

import fxpass as fp
from fxpass.models.llama import build_decoder


def run_rank(directory: Path) -> None:
    """One rank under torchrun: its program, the same inputs, the logits."""
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    program = fp.distributed.load_rank(directory)  # rank<r>.pt2 for dist.get_rank()
    ids = torch.load(directory / "ids.pt")
    logits = program.module()(ids)
    expected = torch.load(directory / "expected.pt")
    error = (logits - expected).abs().max().item()
    print(
        f"rank {dist.get_rank()} of {dist.get_world_size()}: logits {tuple(logits.shape)}, "
        f"{'matches' if error < 1e-4 else 'DIFFERS FROM'} one process (max difference "
        f"{error:.0e})",
        flush=True,
    )
    # Tear down together: a rank that destroys its group while the other still talks to it
    # can abort the other in gloo's threads ("terminate called without an active exception").
    dist.barrier()
    dist.destroy_process_group()


def launch(directory: Path, ranks: int) -> int:
    """torchrun this script on ``directory``; kill the whole launch if it hangs."""
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc-per-node={ranks}", __file__, str(directory),
    ]  # fmt: skip
    proc = subprocess.Popen(command, start_new_session=True)
    try:
        return proc.wait(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return 1


def main() -> int:
    model = build_decoder(layers=2, dtype=torch.float32)
    (ids,) = model.example_inputs()
    program = torch.export.export(model, (ids,))
    shards = fp.shard(program, world_size=2, fuse=True)
    for d in shards.plan.decisions[:3]:
        print(f"{d.param}: {d.style} -- {d.reason}")
    print(shards)
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        shards.save(directory)
        torch.save(ids, directory / "ids.pt")
        torch.save(model(ids).detach(), directory / "expected.pt")
        sys.stdout.flush()
        return launch(directory, shards.world_size)


if __name__ == "__main__":
    if len(sys.argv) > 1:
        run_rank(Path(sys.argv[1]))
    else:
        sys.exit(main())
