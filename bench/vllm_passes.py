"""vLLM's real ``AddRMSNormFusionPass`` (+ ``RMSNormReshapeFusionPass``), registration and
apply, on Inductor's post-grad graphs of 16/64/128-layer decoders: the vLLM side of
``bench/inductor.py --vllm`` (runs in the vLLM environment, ``tools/vllm_env.py``).

    .venv-vllm/bin/python bench/vllm_passes.py {stock,fxpass} OUT.json LAYERS...

Each decoder layer is what vLLM's Transformers backend emits: ``residual = x + residual``,
``vllm_ir.rms_norm(residual)``, a linear layer and SiLU; the token dimension is dynamic, as vLLM marks
it. The post-grad graph is captured from Inductor (its own post-grad passes done) once per
size; ``register`` is the construction of the two passes (vLLM builds them at every engine
start), ``apply`` the two passes on a fresh copy of the graph. With ``fxpass``,
``fxpass.compat.inductor.install()`` runs before vLLM is imported.
"""

from __future__ import annotations

import copy
import json
import sys
import time
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


def post_grad_graph(layers: int) -> fx.GraphModule:
    """Inductor's post-grad graph of an ``layers``-layer decoder (the compile stops there)."""
    import vllm.ir.ops

    class Decoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norms = torch.nn.ParameterList(
                [torch.nn.Parameter(torch.ones(HIDDEN)) for _ in range(layers)]
            )
            self.linears = torch.nn.ModuleList(
                [torch.nn.Linear(HIDDEN, HIDDEN, bias=False) for _ in range(layers)]
            )

        def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
            for w, lin in zip(self.norms, self.linears):
                residual = x + residual
                x = torch.nn.functional.silu(lin(vllm.ir.ops.rms_norm(residual, w, 1e-6)))
            return x + residual

    captured: list[fx.GraphModule] = []

    def post_pass(graph: fx.Graph) -> None:
        captured.append(copy.deepcopy(graph.owning_module))
        raise _Captured

    def backend(gm: fx.GraphModule, example_inputs: list[Any]) -> Any:
        from torch._inductor.compile_fx import compile_fx

        patches = {"post_grad_custom_post_pass": post_pass, "force_disable_caches": True}
        return compile_fx(gm, example_inputs, config_patches=patches)

    torch._dynamo.reset()
    x = torch.randn(8, HIDDEN, dtype=torch.bfloat16)
    residual = torch.randn_like(x)
    torch._dynamo.mark_dynamic(x, 0)
    torch._dynamo.mark_dynamic(residual, 0)
    model = Decoder().to(torch.bfloat16)
    try:
        with torch.no_grad():
            torch.compile(model, backend=backend, fullgraph=True)(x, residual)
    except Exception:  # broad: the capture stops the compile by raising (Dynamo wraps it)
        if not captured:
            raise
    return captured[0]


def measure(layers: int, repeat: int) -> dict[str, Any]:
    from vllm.compilation.passes.fusion.add_rms_fusion import (
        AddRMSNormFusionPass,
        RMSNormReshapeFusionPass,
    )
    from vllm.config import CompilationConfig, CompilationMode, VllmConfig, set_current_vllm_config

    config = VllmConfig(compilation_config=CompilationConfig(mode=CompilationMode.VLLM_COMPILE))
    with set_current_vllm_config(config):
        gm0 = post_grad_graph(layers)
        best: dict[str, float] = {}
        counts: dict[str, int] = {}
        ops: dict[str, int] = {}
        for _ in range(repeat):
            start = time.perf_counter()
            add = AddRMSNormFusionPass(config)
            reshape = RMSNormReshapeFusionPass(config)
            registered = time.perf_counter()
            gm = copy.deepcopy(gm0)
            applying = time.perf_counter()
            add(gm.graph)
            reshape(gm.graph)
            done = time.perf_counter()
            for k, v in (("register", registered - start), ("apply", done - applying)):
                best[k] = min(best.get(k, float("inf")), v)
            counts = {"add_rms": add.matched_count, "reshape": reshape.matched_count}
            ops = {}
            for n in gm.graph.nodes:
                if n.op == "call_function":
                    ops[str(n.target)] = ops.get(str(n.target), 0) + 1
    return {"layers": layers, **best, "matched": counts, "ops": ops}


def main() -> int:
    out = sys.argv[2]
    layers = [int(n) for n in sys.argv[3:]]
    from vllm.platforms import current_platform

    current_platform.import_kernels()
    rows = [measure(n, repeat=1 if n > 64 else 2) for n in layers]
    with open(out, "w") as f:
        json.dump(rows, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
