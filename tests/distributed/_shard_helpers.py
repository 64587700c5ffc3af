"""Sharded programs the single-process tests share (sharding is cheap; exporting is not)."""

from __future__ import annotations

import functools

import torch
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

import fxpass as fp

from _models import exported

C10D = torch.ops._c10d_functional


@functools.cache
def _sharded(world_size: int, **options):
    return fp.shard(exported(dtype=torch.float32), world_size, **options)


def sharded(world_size: int = 2, **options) -> fp.distributed.ShardedPrograms:
    """The 2-layer fp32 decoder sharded for ``world_size`` ranks (shared: do not edit)."""
    return _sharded(world_size, **options)


def count(gm: torch.fx.GraphModule, target) -> int:
    return sum(1 for n in gm.graph.nodes if n.op == "call_function" and n.target is target)


def assert_vals_consistent(ep: torch.export.ExportedProgram) -> None:
    """Every node's meta['val'] is what running the graph on fake inputs gives."""
    gm = ep.graph_module
    stored = {n: n.meta.get("val") for n in gm.graph.nodes}
    mode = next(v.fake_mode for v in stored.values() if hasattr(v, "fake_mode"))
    inputs = [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"]
    copy = torch.fx.GraphModule(gm, gm.graph)  # FakeTensorProp writes meta: compare after
    FakeTensorProp(copy, mode).propagate_dont_convert_inputs(*inputs)
    for n in gm.graph.nodes:
        old, new = stored[n], n.meta.get("val")
        if isinstance(old, torch.Tensor):
            assert (old.shape, old.dtype, old.stride()) == (new.shape, new.dtype, new.stride()), n
        n.meta["val"] = old
