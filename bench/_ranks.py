"""Gloo ranks for the sharding benchmarks (``shard.py`` and its second table,
``_shard_families.py``): spawning them with every wait bounded, and counting what a forward
sends over the wire."""

from __future__ import annotations

import pickle
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

C10D = torch.ops._c10d_functional
TIMEOUT = 900


# ----- counting what goes over the wire -------------------------------------------------------
class CommBytes(TorchDispatchMode):
    """Counts the collectives a forward issues and the bytes of the full tensors they reduce
    or gather (DTensor's ops are let through first, so their collectives are seen too)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: dict[str, int] = {}
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from torch.distributed.tensor import DTensor

        if any(issubclass(t, DTensor) for t in types):
            return NotImplemented
        out = func(*args, **(kwargs or {}))
        name = str(func.overloadpacket).split(".")[-1]
        sized = None
        if func in (C10D.all_reduce.default, C10D.reduce_scatter_tensor.default):
            sized = args[0]
        elif func is C10D.all_gather_into_tensor.default:
            sized = out
        elif func is torch.ops.fxpass.all_reduce_add_rmsnorm.default:
            sized, name = args[0], "all_reduce"
        if sized is not None:
            self.calls[name] = self.calls.get(name, 0) + 1
            self.bytes += sized.numel() * sized.element_size()
        return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(world_size: int, jobs: list[dict], target: Any) -> list[dict]:
    """Run every job on ``world_size`` gloo ranks (one spawn): ``target(rank, world_size,
    port, jobs, out_dir)`` writes ``rank{rank}.pkl`` there; every wait is bounded."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as out:
        ctx = mp.start_processes(target, args=(world_size, _free_port(), jobs, out),
                                 nprocs=world_size, join=False, start_method="spawn")  # fmt: skip
        deadline = time.monotonic() + TIMEOUT
        try:
            while not ctx.join(timeout=max(1.0, deadline - time.monotonic())):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{world_size} ranks did not finish in {TIMEOUT} s")
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
                p.join(10)
        return [pickle.loads(Path(out, f"rank{r}.pkl").read_bytes()) for r in range(world_size)]
