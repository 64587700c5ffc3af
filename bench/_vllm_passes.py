"""vLLM's real ``AddRMSNormFusionPass`` (+ ``RMSNormReshapeFusionPass``) and
``RMSNormQuantFusionPass``, registration and apply, on Inductor's post-grad graphs of
16/64/128-layer decoders: the vLLM side of ``bench/inductor.py --vllm`` (runs in the vLLM
environment, ``tools/vllm_env.py``; the fused fp8 kernels from ``tests/compat/vllm/cpu_ops``).

    .venv-vllm/bin/python bench/_vllm_passes.py {stock,fxpass} OUT.json LAYERS...

Two decoders (``_add_rms_decoder``, ``_quant_decoder``), their token dimension dynamic, as
vLLM marks it. The post-grad graph is captured from Inductor (its own post-grad passes done)
once per size; ``register`` is the construction of the passes (vLLM builds them at every engine
start), ``apply`` the passes on a fresh copy of the graph: wall and CPU seconds of the process
(``*_cpu``; other work on a shared machine slows the wall clock, much less the CPU time). With ``fxpass``,
``fxpass.compat.inductor.install()`` runs before vLLM is imported.
"""

from __future__ import annotations

import copy
import json
import sys
import time
from pathlib import Path
from typing import Any

MODE = sys.argv[1] if __name__ == "__main__" else "stock"
if MODE == "fxpass":
    import fxpass.compat.inductor as fxi

    fxi.install()

import torch  # noqa: E402
from torch import fx  # noqa: E402

HIDDEN = 64


class _Captured(Exception):
    pass


def _add_rms_decoder(layers: int) -> torch.nn.Module:
    """What vLLM's Transformers backend emits per layer: residual add, vLLM IR RMSNorm, a
    linear layer, SiLU (AddRMSNormFusionPass's sites)."""
    import vllm.ir.ops

    class Decoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norms = [torch.rand(HIDDEN) + 0.5 for _ in range(layers)]
            self.linears = [torch.rand(HIDDEN, HIDDEN) / HIDDEN for _ in range(layers)]

        def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
            for w, lin in zip(self.norms, self.linears):
                residual = x + residual
                x = torch.nn.functional.silu(vllm.ir.ops.rms_norm(residual, w, 1e-6) @ lin)
            return x + residual

    return Decoder()


def _quant_decoder(layers: int) -> torch.nn.Module:
    """vLLM's Llama with static fp8 activations: fused add + RMSNorm (vLLM IR), vLLM's
    ``QuantFP8`` (native form), a dequantizing linear layer (RMSNormQuantFusionPass's sites)."""
    import vllm.ir.ops
    from vllm.model_executor.layers.quantization.input_quant_fp8 import QuantFP8
    from vllm.model_executor.layers.quantization.utils.quant_utils import GroupShape

    class Decoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.quant = QuantFP8(static=True, group_shape=GroupShape.PER_TENSOR)
            self.scale = torch.tensor([0.05], dtype=torch.float32)
            self.norms = [torch.rand(HIDDEN) + 0.5 for _ in range(layers)]
            self.linears = [torch.rand(HIDDEN, HIDDEN) / HIDDEN for _ in range(layers)]

        def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
            for w, lin in zip(self.norms, self.linears):
                y, residual = vllm.ir.ops.fused_add_rms_norm(x, residual, w, 1e-6)
                q, s = self.quant(y, self.scale)
                x = (q.to(torch.float32) * s).to(y.dtype) @ lin
            return x + residual

    return Decoder()


def post_grad_graph(model: torch.nn.Module) -> fx.GraphModule:
    """Inductor's post-grad graph of ``model`` (the compile stops there), the token
    dimension dynamic."""
    captured: list[fx.GraphModule] = []

    def post_pass(graph: fx.Graph) -> None:
        captured.append(copy.deepcopy(graph.owning_module))
        raise _Captured

    def backend(gm: fx.GraphModule, example_inputs: list[Any]) -> Any:
        from torch._inductor.compile_fx import compile_fx

        patches = {"post_grad_custom_post_pass": post_pass, "force_disable_caches": True}
        return compile_fx(gm, example_inputs, config_patches=patches)

    torch._dynamo.reset()
    x = torch.randn(8, HIDDEN)
    residual = torch.randn_like(x)
    torch._dynamo.mark_dynamic(x, 0)
    torch._dynamo.mark_dynamic(residual, 0)
    try:
        with torch.no_grad():
            torch.compile(model, backend=backend, fullgraph=True)(x, residual)
    except Exception:  # broad: the capture stops the compile by raising (Dynamo wraps it)
        if not captured:
            raise
    return captured[0]


def _add_rms_passes(config: Any) -> list[Any]:
    from vllm.compilation.passes.fusion.add_rms_fusion import (
        AddRMSNormFusionPass,
        RMSNormReshapeFusionPass,
    )

    return [AddRMSNormFusionPass(config), RMSNormReshapeFusionPass(config)]


def _quant_passes(config: Any) -> list[Any]:
    from vllm.compilation.passes.fusion.rms_quant_fusion import RMSNormQuantFusionPass

    return [RMSNormQuantFusionPass(config)]


BENCHES = {
    "add_rms": (_add_rms_decoder, _add_rms_passes),
    "rms_quant": (_quant_decoder, _quant_passes),
}


def measure(bench: str, layers: int, repeat: int) -> dict[str, Any]:
    from vllm.config import CompilationConfig, CompilationMode, VllmConfig, set_current_vllm_config

    make_model, make_passes = BENCHES[bench]
    config = VllmConfig(compilation_config=CompilationConfig(mode=CompilationMode.VLLM_COMPILE))
    with set_current_vllm_config(config):
        torch.set_default_dtype(torch.bfloat16)
        gm0 = post_grad_graph(make_model(layers))
        best: dict[str, float] = {}
        counts: dict[str, int] = {}
        ops: dict[str, int] = {}
        runs: dict[str, list[float]] = {}
        for _ in range(repeat):
            start, start_cpu = time.perf_counter(), time.process_time()
            passes = make_passes(config)
            registered, registered_cpu = time.perf_counter(), time.process_time()
            gm = copy.deepcopy(gm0)
            applying, applying_cpu = time.perf_counter(), time.process_time()
            for p in passes:
                p(gm.graph)
            done, done_cpu = time.perf_counter(), time.process_time()
            for k, v in (
                ("register", registered - start),
                ("apply", done - applying),
                ("register_cpu", registered_cpu - start_cpu),
                ("apply_cpu", done_cpu - applying_cpu),
            ):
                best[k] = min(best.get(k, float("inf")), v)
                runs.setdefault(k, []).append(v)
            counts = {p.pass_name: p.matched_count for p in passes}
            ops = {}
            for n in gm.graph.nodes:
                if n.op == "call_function":
                    ops[str(n.target)] = ops.get(str(n.target), 0) + 1
        torch.set_default_dtype(torch.float32)
    return {"bench": bench, "layers": layers, **best, "runs": runs, "matched": counts, "ops": ops}


def main() -> int:
    out = sys.argv[2]
    layers = [int(n) for n in sys.argv[3:]]
    from vllm.platforms import current_platform

    current_platform.import_kernels()
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "compat" / "vllm"))
    import cpu_ops  # noqa: F401  (the fused fp8 kernels vLLM's CPU build lacks)

    rows = [measure(bench, n, repeat=1 if n > 64 else 2) for bench in BENCHES for n in layers]
    with open(out, "w") as f:
        json.dump(rows, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
