"""Run a function in N processes that form a gloo process group on 127.0.0.1.

``run(fn, world_size, payload)`` starts one process per rank (spawned, so nothing of the
test process leaks in), each joins the group on a free port, calls ``fn(rank, world_size,
payload)`` and writes what it returns (or its traceback) to a file; the parent waits at
most ``timeout`` seconds in all, kills what is left, and returns the results in rank order
or raises with every failing rank's traceback. ``fn`` must be importable (a module-level
function of a module on ``sys.path``).
"""

from __future__ import annotations

import datetime
import multiprocessing
import os
import pickle
import socket
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["free_port", "run"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world_size: int, port: int, fn: Callable, payload: Any, out: str) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    result: tuple[str, Any]
    try:
        dist.init_process_group(
            "gloo", rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=120)
        )
        try:
            result = ("ok", fn(rank, world_size, payload))
        finally:
            dist.destroy_process_group()
    except BaseException:
        result = ("error", traceback.format_exc())
    Path(out, f"rank{rank}.pkl").write_bytes(pickle.dumps(result))


def run(fn: Callable, world_size: int, payload: Any = None, *, timeout: float = 300) -> list[Any]:
    ctx = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="fxpass-dist-") as out:
        port = free_port()
        procs = [
            ctx.Process(target=_worker, args=(r, world_size, port, fn, payload, out))
            for r in range(world_size)
        ]
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout
        try:
            for p in procs:
                p.join(max(0.0, deadline - time.monotonic()))
        finally:
            for p in procs:
                if p.is_alive():
                    p.kill()
                p.join(10)
        results, errors = [], []
        for rank, p in enumerate(procs):
            path = Path(out, f"rank{rank}.pkl")
            if not path.exists():
                errors.append(f"rank {rank}: no result (exit code {p.exitcode}; timed out?)")
                continue
            status, value = pickle.loads(path.read_bytes())
            if status != "ok":
                errors.append(f"rank {rank} failed:\n{value}")
            results.append(value)
        if errors:
            raise AssertionError("\n".join(errors))
        return results
