"""vLLM's own compilation passes, run unmodified: the half of the test that runs in the vLLM
environment (``tools/vllm_env.py``), by subprocess from ``test_vllm_passes.py``.

    .venv-vllm/bin/python tests/compat/vllm/vllm_side.py {stock,fxpass} OUT.json [CASE...]

With ``fxpass``, ``fxpass.compat.inductor.install()`` runs before anything of vLLM's is
imported, so vLLM's pass modules bind fxpass's pattern matcher exactly as they would bind
Inductor's. Each case builds a model the way vLLM's ``tests/compile`` does, compiles it with
``torch.compile`` and Inductor, the passes run as Inductor's ``post_grad_custom_post_pass``
(as vLLM's ``TestBackend`` runs them), and the case records: every pass's ``matched_count``,
vLLM's global match table, the post-pass graph (op counts and code), the outputs' bytes, and
the time spent constructing the passes (registration) and running them (apply).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

MODE = sys.argv[1] if __name__ == "__main__" else "stock"
if MODE == "fxpass":
    import fxpass.compat.inductor as fxi

    fxi.install()

import torch  # noqa: E402
from torch import fx  # noqa: E402

CPU_ONLY_NOTE = "fp8/fused kernels are missing on vLLM's CPU build"


# ----- the compile harness: Inductor with the passes as its post-grad custom pass -------------
class Backend:
    """Inductor, running ``passes`` after its own post-grad passes (as vLLM's TestBackend)."""

    def __init__(
        self, passes: list[Callable[[fx.Graph], None]], inductor_config: dict[str, Any]
    ) -> None:
        self.passes = passes
        self.inductor_config = inductor_config
        self.apply_s = 0.0
        self.graph_post_pass: fx.Graph | None = None
        self.graph_pre_pass: str = ""

    def post_pass(self, graph: fx.Graph) -> None:
        self.graph_pre_pass = str(graph)
        start = time.perf_counter()
        for p in self.passes:
            p(graph)
        self.apply_s += time.perf_counter() - start
        self.graph_post_pass = graph

    def __call__(self, gm: fx.GraphModule, example_inputs: list[Any]) -> Any:
        from torch._inductor.compile_fx import compile_fx

        patches = {
            **self.inductor_config,
            "post_grad_custom_post_pass": self.post_pass,
            "force_disable_caches": True,
        }
        return compile_fx(gm, example_inputs, config_patches=patches)


def op_counts(graph: fx.Graph) -> dict[str, int]:
    counts: Counter[str] = Counter()
    for n in graph.nodes:
        if n.op == "call_function":
            name = str(n.target)
            if "auto_functionalized" in name and n.args:
                name = f"auto_functionalized({n.args[0]})"
            counts[name] += 1
    return dict(sorted(counts.items()))


def graph_code(graph: fx.Graph) -> str:
    return graph.python_code("self").src


def digest(outputs: Any) -> list[str]:
    import hashlib

    flat = outputs if isinstance(outputs, (list, tuple)) else [outputs]
    return [
        hashlib.sha256(t.detach().contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()
        for t in flat
    ]


def compiled_run(
    passes: list[Any],
    model: torch.nn.Module,
    *inputs: Any,
    inductor_config: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``inductor_config``: vLLM's own Inductor settings
    (``compilation_config.inductor_compile_config``, as vLLM's TestBackend applies them)."""
    torch._dynamo.reset()
    backend = Backend(passes, inductor_config or {})
    with torch.no_grad():  # inference graphs, as vLLM compiles them
        eager = model(*inputs)
        out = torch.compile(model, backend=backend, fullgraph=True)(*inputs)
    flat_e = eager if isinstance(eager, tuple) else (eager,)
    flat_o = out if isinstance(out, tuple) else (out,)
    close = all(torch.allclose(a, b, atol=5e-2, rtol=5e-2) for a, b in zip(flat_e, flat_o))
    equal = all(torch.equal(a, b) for a, b in zip(flat_e, flat_o))
    graph = backend.graph_post_pass
    assert graph is not None, "Inductor never ran the custom post-grad pass"
    return {
        "ops": op_counts(graph),
        "code": graph_code(graph),
        "outputs": digest(out),
        "close_to_eager": close,
        "equal_to_eager": equal,
        "apply_s": backend.apply_s,
    }


# ----- the cases: each built as vLLM's tests/compile builds it --------------------------------
def vllm_config():
    from vllm.config import CompilationConfig, CompilationMode, VllmConfig

    return VllmConfig(compilation_config=CompilationConfig(mode=CompilationMode.VLLM_COMPILE))


def construct(make: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    p = make()
    return p, time.perf_counter() - start


def case_add_rms_reshape(residual_first: bool) -> dict[str, Any]:
    """tests/compile/passes/test_rmsnorm_reshape_fusion.py::test_add_rmsnorm_reshape_fusion."""
    import vllm.ir.ops
    from vllm.compilation.passes.fusion.add_rms_fusion import (
        AddRMSNormFusionPass,
        RMSNormReshapeFusionPass,
    )
    from vllm.compilation.passes.utility.noop_elimination import NoOpEliminationPass
    from vllm.compilation.passes.utility.post_cleanup import PostCleanupPass
    from vllm.config import set_current_vllm_config

    class AddRMSNormModel(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.randn(32))

        def forward(self, x: torch.Tensor, residual: torch.Tensor) -> Any:
            residual = residual + x if residual_first else x + residual
            rms = vllm.ir.ops.rms_norm(residual, self.weight, 1e-6)
            return rms.reshape(-1, rms.shape[-1]), residual

    config = vllm_config()
    with set_current_vllm_config(config):
        torch.set_default_dtype(torch.bfloat16)
        torch.manual_seed(0)
        add, t_add = construct(lambda: AddRMSNormFusionPass(config))
        reshape, t_reshape = construct(lambda: RMSNormReshapeFusionPass(config))
        model = AddRMSNormModel()
        x = torch.randn(2, 7, 32)
        residual = torch.randn_like(x)
        passes = [NoOpEliminationPass(config), add, reshape, PostCleanupPass(config)]
        run = compiled_run(passes, model, x, residual)
        torch.set_default_dtype(torch.float32)
    run["matched"] = {"add_rms": add.matched_count, "reshape": reshape.matched_count}
    run["register_s"] = t_add + t_reshape
    return run


def case_rms_reshape() -> dict[str, Any]:
    """tests/compile/passes/test_rmsnorm_reshape_fusion.py::test_rmsnorm_reshape_fusion."""
    import vllm.ir.ops
    from vllm.compilation.passes.fusion.add_rms_fusion import RMSNormReshapeFusionPass
    from vllm.compilation.passes.utility.noop_elimination import NoOpEliminationPass
    from vllm.compilation.passes.utility.post_cleanup import PostCleanupPass
    from vllm.config import set_current_vllm_config

    class RMSNormModel(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.randn(32))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            rms = vllm.ir.ops.rms_norm(x, self.weight, 1e-6)
            return rms.reshape(-1, rms.shape[-1])

    config = vllm_config()
    with set_current_vllm_config(config):
        torch.set_default_dtype(torch.bfloat16)
        torch.manual_seed(0)
        reshape, t = construct(lambda: RMSNormReshapeFusionPass(config))
        passes = [NoOpEliminationPass(config), reshape, PostCleanupPass(config)]
        run = compiled_run(passes, RMSNormModel(), torch.randn(2, 7, 32))
        torch.set_default_dtype(torch.float32)
    run["matched"] = {"reshape": reshape.matched_count}
    run["register_s"] = t
    return run


def case_ir_lowering() -> dict[str, Any]:
    """tests/compile/passes/ir/test_lowering.py: vLLM IR lowered through
    ``register_graph_pattern(CallFunctionVarArgs(...))`` + ``Match.replace_by_example``."""
    import vllm.kernels  # noqa: F401  (registers the IR ops' implementations)
    from vllm import ir
    from vllm.compilation.passes.ir.lowering_pass import VllmIRLoweringPass
    from vllm.config import set_current_vllm_config
    from vllm.ir import ops

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.ones(16, dtype=torch.bfloat16)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x2 = ops.rms_norm(x + 4.0, self.weight, 1e-5)
            x4 = ops.rms_norm(x2 * 5.0, None, 1e-5)
            return ops.rms_norm(x4 / 2.0, self.weight, 1e-5, 8) + 3.0

    config = vllm_config()
    results = {}
    with set_current_vllm_config(config):
        for provider in ops.rms_norm.supported_providers():
            lowering, t = construct(lambda: VllmIRLoweringPass(config))
            with ops.rms_norm.set_priority([provider, "native"]), ir.enable_torch_wrap(True):
                x = torch.randn(
                    8, 16, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(0)
                )
                run = compiled_run([lowering], Model(), x)
            run["matched"] = {"selected": dict(lowering.selected_impls["rms_norm"])}
            run["register_s"] = t
            results[provider] = run
    return results


def case_rms_quant(static: bool) -> dict[str, Any]:
    """tests/compile/passes/test_fusion.py::test_fusion_rmsnorm_quant, as it runs without
    vLLM's fp8 linear kernels: RMSNorm (vLLM IR) and add + RMSNorm followed by vLLM's
    ``QuantFP8`` (static per-tensor or dynamic per-token, its native form), into the fused
    kernels (defined by ``cpu_ops``); the token dimension dynamic, as there."""
    import vllm.ir.ops
    from vllm.compilation.passes.fusion.rms_quant_fusion import RMSNormQuantFusionPass
    from vllm.compilation.passes.utility.noop_elimination import NoOpEliminationPass
    from vllm.compilation.passes.utility.post_cleanup import PostCleanupPass
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.quantization.input_quant_fp8 import QuantFP8
    from vllm.model_executor.layers.quantization.utils.quant_utils import GroupShape

    hidden, eps = 64, 1e-5

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            group = GroupShape.PER_TENSOR if static else GroupShape.PER_TOKEN
            self.quant = QuantFP8(static=static, group_shape=group)
            self.norms = [torch.rand(hidden) + 0.5 for _ in range(3)]
            self.weights = [torch.rand(hidden, hidden) / hidden for _ in range(2)]
            self.scale = torch.tensor([0.05], dtype=torch.float32)

        def quant_linear(self, y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            q, s = self.quant(y, self.scale if static else None)
            return (q.to(torch.float32) * s).to(y.dtype) @ w

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = resid = torch.relu(x)
            y = vllm.ir.ops.rms_norm(x, self.norms[0], eps)
            x2 = self.quant_linear(y, self.weights[0])
            y2, resid = vllm.ir.ops.fused_add_rms_norm(x2, resid, self.norms[1], eps)
            x3 = self.quant_linear(y2, self.weights[1])
            y3, resid = vllm.ir.ops.fused_add_rms_norm(x3, resid, self.norms[2], eps)
            q, _ = self.quant(y3, self.scale if static else None)
            return q.to(torch.float32)

    config = vllm_config()
    with set_current_vllm_config(config):
        torch.set_default_dtype(torch.bfloat16)
        torch.manual_seed(1)
        fusion, t = construct(lambda: RMSNormQuantFusionPass(config))
        passes = [NoOpEliminationPass(config), fusion, PostCleanupPass(config)]
        x = torch.rand(33, hidden)
        torch._dynamo.mark_dynamic(x, 0)
        run = compiled_run(passes, Model(), x)
        torch.set_default_dtype(torch.float32)
    run["matched"] = {"rms_quant": fusion.matched_count}
    run["register_s"] = t
    run["patterns"] = sum(len(v) for v in fusion.patterns.patterns.values())
    return run


def case_act_quant() -> dict[str, Any]:
    """tests/compile/passes/test_silu_mul_quant_fusion.py, as it runs without vLLM's fp8
    linear kernels: ``SiluAndMul`` (its native form) followed by vLLM's static per-tensor
    ``QuantFP8``, into ``_C.silu_and_mul_quant`` (defined by ``cpu_ops``); the token
    dimension dynamic."""
    from vllm.compilation.passes.fusion.act_quant_fusion import ActivationQuantFusionPass
    from vllm.compilation.passes.utility.noop_elimination import NoOpEliminationPass
    from vllm.compilation.passes.utility.post_cleanup import PostCleanupPass
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.activation import SiluAndMul
    from vllm.model_executor.layers.quantization.input_quant_fp8 import QuantFP8
    from vllm.model_executor.layers.quantization.utils.quant_utils import GroupShape

    hidden = 64
    config = vllm_config()
    with set_current_vllm_config(config):

        class Model(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.silu_and_mul = SiluAndMul()
                self.quant = QuantFP8(static=True, group_shape=GroupShape.PER_TENSOR)
                self.scale = torch.tensor([0.05], dtype=torch.float32)
                self.weight = torch.rand(hidden, hidden) / hidden

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                y = self.silu_and_mul(x)
                q, s = self.quant(y, self.scale)
                return (q.to(torch.float32) * s).to(y.dtype) @ self.weight

        torch.set_default_dtype(torch.bfloat16)
        torch.manual_seed(2)
        fusion, t = construct(lambda: ActivationQuantFusionPass(config))
        passes = [NoOpEliminationPass(config), fusion, PostCleanupPass(config)]
        x = torch.rand(33, 2 * hidden)
        torch._dynamo.mark_dynamic(x, 0)
        run = compiled_run(passes, Model(), x)
        torch.set_default_dtype(torch.float32)
    run["matched"] = {"act_quant": fusion.matched_count}
    run["register_s"] = t
    return run


def case_qk_norm_rope(is_neox: bool, dtype: Any, eps: float) -> dict[str, Any]:
    """tests/compile/passes/test_qk_norm_rope_fusion.py::test_qk_norm_rope_fusion, on CPU:
    vLLM's ``Attention`` (registered in the config, so the pass finds its geometry), per-head
    ``RMSNorm`` of q and k and ``RotaryEmbedding`` (custom ops on: ``_C.rotary_embedding``)
    into ``_C.fused_qk_norm_rope`` (defined by ``cpu_ops``); tokens dynamic; compiled with
    vLLM's Inductor settings, as its TestBackend (auto-functionalization v1, which the pass's
    patterns are written for). vLLM's ``dump_patterns`` of the pass is recorded too (it
    registers nothing without the attention layers). The pass keeps no entry in vLLM's match
    table (its ``__call__`` only sets ``matched_count``)."""
    import tempfile
    from pathlib import Path

    from vllm.compilation.passes.fusion.qk_norm_rope_fusion import QKNormRoPEFusionPass
    from vllm.compilation.passes.utility.noop_elimination import NoOpEliminationPass
    from vllm.compilation.passes.utility.post_cleanup import PostCleanupPass
    from vllm.config import (
        CompilationConfig,
        CompilationMode,
        ModelConfig,
        PassConfig,
        VllmConfig,
        set_current_vllm_config,
    )
    from vllm.model_executor.layers.attention import Attention
    from vllm.model_executor.layers.layernorm import RMSNorm
    from vllm.model_executor.layers.rotary_embedding import RotaryEmbedding
    from vllm.v1.attention.backend import AttentionType

    num_heads, num_kv_heads, head_dim, tokens = 16, 4, 128, 5
    q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim

    class Model(torch.nn.Module):
        def __init__(self, config: Any) -> None:
            super().__init__()
            self.attn = Attention(
                num_heads=num_heads,
                head_size=head_dim,
                scale=head_dim**-0.5,
                num_kv_heads=num_kv_heads,
                cache_config=config.cache_config,
                prefix="model.layers.0.self_attn.attn",
                attn_type=AttentionType.DECODER,
            )
            self.q_norm = RMSNorm(head_dim, eps=eps)
            self.k_norm = RMSNorm(head_dim, eps=eps)
            for norm in (self.q_norm, self.k_norm):  # not all ones: the weights matter
                norm.weight.data.normal_(mean=1.0, std=0.1)
            self.rotary_emb = RotaryEmbedding(
                head_dim,
                rotary_dim=head_dim,
                max_position_embeddings=4096,
                base=10000,
                is_neox_style=is_neox,
                dtype=dtype,
            )

        def forward(self, qkv: torch.Tensor, positions: torch.Tensor) -> Any:
            q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
            q = self.q_norm(q.view(*q.shape[:-1], num_heads, head_dim)).view(q.shape)
            k = self.k_norm(k.view(*k.shape[:-1], num_kv_heads, head_dim)).view(k.shape)
            q, k = self.rotary_emb(positions, q, k)
            return q, k, v

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "model"  # a config only, saved here: ModelConfig reads one
        from transformers import LlamaConfig

        LlamaConfig(
            hidden_size=num_heads * head_dim,
            num_attention_heads=num_heads,
            num_key_value_heads=num_kv_heads,
            head_dim=head_dim,
            num_hidden_layers=1,
            intermediate_size=64,
            vocab_size=64,
            max_position_embeddings=4096,
        ).save_pretrained(model_dir)
        config = VllmConfig(
            model_config=ModelConfig(model=str(model_dir), dtype=dtype, skip_tokenizer_init=True),
            compilation_config=CompilationConfig(
                mode=CompilationMode.VLLM_COMPILE,
                custom_ops=["+rms_norm", "+rotary_embedding"],
                pass_config=PassConfig(enable_qk_norm_rope_fusion=True, eliminate_noops=True),
                debug_dump_path=Path(tmp) / "dump",
            ),
        )
        with set_current_vllm_config(config):
            torch.set_default_dtype(dtype)
            torch.manual_seed(3)
            model = Model(config)
            fusion, t = construct(lambda: QKNormRoPEFusionPass(config))
            passes = [NoOpEliminationPass(config), fusion, PostCleanupPass(config)]
            qkv = torch.randn(tokens, q_size + 2 * kv_size)
            positions = torch.arange(tokens, dtype=torch.long)
            torch._dynamo.mark_dynamic(qkv, 0)
            torch._dynamo.mark_dynamic(positions, 0)
            inductor_config = config.compilation_config.inductor_compile_config
            run = compiled_run(passes, model, qkv, positions, inductor_config=inductor_config)
            torch.set_default_dtype(torch.float32)
        dumps = config.compile_debug_dump_path().glob("patterns.*.py")
        run["dumps"] = {p.name: p.read_text() for p in sorted(dumps)}
    run["matched"] = {"qk_norm_rope": fusion.matched_count}
    run["register_s"] = t
    run["patterns"] = sum(len(v) for v in fusion.patterns.patterns.values())
    return run


def case_dump_patterns() -> dict[str, Any]:
    """``VllmPatternMatcherPass.dump_patterns``: every registered pattern printed by
    Inductor's ``PatternPrettyPrinter`` (as vLLM dumps them with ``debug_dump_path``)."""
    import tempfile

    from vllm.compilation.passes.fusion.add_rms_fusion import AddRMSNormFusionPass
    from vllm.compilation.passes.fusion.rms_quant_fusion import RMSNormQuantFusionPass
    from vllm.config import CompilationConfig, CompilationMode, VllmConfig, set_current_vllm_config

    with tempfile.TemporaryDirectory() as tmp:
        config = VllmConfig(
            compilation_config=CompilationConfig(
                mode=CompilationMode.VLLM_COMPILE, debug_dump_path=tmp
            )
        )
        with set_current_vllm_config(config):
            AddRMSNormFusionPass(config)
            RMSNormQuantFusionPass(config)
        dumps = {
            p.name: p.read_text() for p in sorted(config.compile_debug_dump_path().glob("*.py"))
        }
    assert dumps, "vLLM dumped no patterns"
    return {"matched": {"files": len(dumps)}, "dumps": dumps}


CASES: dict[str, Callable[[], Any]] = {
    "add_rms_reshape[residual_first]": lambda: case_add_rms_reshape(True),
    "add_rms_reshape[branch_first]": lambda: case_add_rms_reshape(False),
    "rms_reshape": case_rms_reshape,
    "ir_lowering": case_ir_lowering,
    "rms_quant[static]": lambda: case_rms_quant(True),
    "rms_quant[dynamic]": lambda: case_rms_quant(False),
    "act_quant": case_act_quant,
    "qk_norm_rope[neox-fp16]": lambda: case_qk_norm_rope(True, torch.float16, 1e-6),
    "qk_norm_rope[gptj-bf16]": lambda: case_qk_norm_rope(False, torch.bfloat16, 1e-5),
    "dump_patterns": case_dump_patterns,
}


def main() -> int:
    out_path = sys.argv[2]
    names = sys.argv[3:] or list(CASES)
    from vllm.platforms import current_platform

    current_platform.import_kernels()  # the AVX2 build of vllm/_C on machines without AVX-512
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import cpu_ops  # noqa: F401  (the fused kernels the fusions rewrite to; missing on CPU)
    from vllm.compilation.passes.vllm_inductor_pass import get_match_table

    results: dict[str, Any] = {}
    for name in names:
        try:
            results[name] = {"ok": True, "result": CASES[name]()}
        except Exception as e:  # broad: reported per case to the driver, which fails it
            import traceback

            results[name] = {
                "ok": False,
                "error": f"{type(e).__name__}: {e}",
                "traceback": traceback.format_exc(),
            }
    results["_match_table"] = {"ok": True, "result": get_match_table()}
    with open(out_path, "w") as f:
        json.dump(results, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
