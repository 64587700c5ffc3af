"""What each rank runs in the distributed tests (imported in the spawned processes)."""

from __future__ import annotations

from typing import Any

import torch
import torch._functorch.config
import torch._inductor.config

import fxpass
from fxpass.distributed import load_rank, weight_bytes

C10D = "_c10d_functional"


def logits(out: Any) -> torch.Tensor:
    """The logits of a decoder's output: a tensor, a tuple, or a Hugging Face output."""
    if isinstance(out, (tuple, list)):
        return out[0]
    return getattr(out, "logits", out)


def _ops(gm: torch.fx.GraphModule) -> dict[str, int]:
    counts: dict[str, int] = {}
    for n in gm.graph.nodes:
        if n.op == "call_function" and (C10D in str(n.target) or "fxpass" in str(n.target)):
            name = str(n.target).split(".")[-2]
            counts[name] = counts.get(name, 0) + 1
    return counts


def _loaded(case: dict[str, Any]) -> dict[str, Any]:
    """The rank's .pt2 as torch.export.load reads it: its output, its collectives, and the
    bytes of its weights by storage (a slice that kept its whole tensor counts whole)."""
    program = load_rank(case["dir"])
    (ids,) = torch.load(case["inputs"])
    expected = torch.load(case["expected"])
    out = logits(program.module()(ids))
    return {
        "err": (out - expected).abs().max().item(),
        "ops": _ops(program.graph_module),
        "bytes": weight_bytes(program),
    }


def _backend(case: dict[str, Any]) -> dict[str, Any]:
    """The tensor_parallel pass inside torch.compile: it takes the rank from the group."""
    from fxpass.models.llama import build_decoder

    model = build_decoder(layers=1, dtype=torch.float32)
    (ids,) = model.example_inputs()
    be = fxpass.backend(case["pipeline"], ir="aten", compiler=case["compiler"])
    # an earlier run's cached graph would skip the passes (and their statistics)
    no_cache = (
        torch._inductor.config.patch(fx_graph_cache=False),
        torch._functorch.config.patch(enable_autograd_cache=False),
    )
    with torch.no_grad(), no_cache[0], no_cache[1]:  # inference: training graphs not sharded
        expected = model(ids)
        out = torch.compile(model, backend=be)(ids)
    stats = be.reports[0].stats() if be.reports else {}
    return {"err": (out - expected).abs().max().item(), "stats": stats}


def run_cases(rank: int, world_size: int, cases: list[dict[str, Any]]) -> dict[str, Any]:
    if any(c.get("hf") for c in cases):  # what loading Hugging Face programs needs
        import transformers.integrations.moe
        import transformers.modeling_outputs  # noqa: F401  (their outputs' pytree nodes)
    results = {}
    for case in cases:
        kind = case.get("kind", "loaded")
        run = {"backend": _backend, "pipeline": _pipeline}.get(kind, _loaded)
        results[case["name"]] = run(case)
    return results


def _pipeline(case: dict[str, Any]) -> dict[str, Any]:
    """The rank's stage under a pipelining schedule, microbatches of the captured batch."""
    from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe

    from fxpass.distributed import load_stage

    stage = load_stage(case["dir"])
    (ids,) = torch.load(case["inputs"])
    schedule = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[case.get("schedule", "gpipe")]
    run = schedule(stage, n_microbatches=ids.shape[0])
    with torch.no_grad():
        out = run.step(ids) if stage.is_first else run.step()
    nbytes = weight_bytes(stage.submod)
    if not stage.is_last:
        return {"err": 0.0, "last": False, "bytes": nbytes}
    expected = torch.load(case["expected"])
    return {"err": (logits(out) - expected).abs().max().item(), "last": True, "bytes": nbytes}
