"""``vllm.LLM`` end to end on CPU with vLLM's passes, on stock Inductor or on fxpass: the half
of ``test_vllm_engine.py`` that runs in the vLLM environment.

    .venv-vllm/bin/python tests/compat/vllm/engine_side.py {stock,fxpass} MODEL_DIR OUT.json

A tiny Llama with random weights and a word-level tokenizer, both built here and saved to
MODEL_DIR (no hub), served by vLLM's Transformers backend (``model_impl="transformers"``:
the residual add and RMSNorm stay separate, for ``AddRMSNormFusionPass``); greedy generation.
On CPU vLLM compiles with Dynamo + Inductor (``DYNAMO_TRACE_ONCE``) and builds none of its
passes: here its ``PostGradPassManager`` is handed to Inductor as the post-grad custom pass
through the compilation config, configured from the engine's own config at its first call,
and vLLM IR's torch wrapping is left on (the CPU platform turns it off) so the graph has the
IR ops the passes match. Records the token ids, vLLM's match table and the engine's
start-up time (``LLM(...)``, which compiles the model and so runs the passes).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault(
    "VLLM_DISABLE_COMPILE_CACHE", "1"
)  # compile, and so run the passes, each time

MODE = sys.argv[1] if __name__ == "__main__" else "stock"
if MODE == "fxpass":
    import fxpass.compat.inductor as fxi

    fxi.install()

import torch  # noqa: E402

WORDS = [
    "the",
    "a",
    "cat",
    "dog",
    "sat",
    "on",
    "mat",
    "ran",
    "far",
    "fast",
    "slow",
    "red",
    "blue",
    "big",
    "small",
    "and",
    "then",
    "it",
    "was",
]


def build_model(path: Path) -> None:
    """Config, random weights and a tokenizer, saved to ``path``."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>"]
    vocab = {w: i for i, w in enumerate(specials + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    fast.save_pretrained(path)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=128,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        bos_token_id=1,
        eos_token_id=2,
        torch_dtype="bfloat16",
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(path)


#: the engine's VllmConfig, as the CPU platform leaves it
ENGINE_CONFIG: list = []
#: the pass managers the engine built (one per compiled graph)
BUILT: list = []


class PassManagerFromEngine:
    """vLLM's PostGradPassManager, built from the engine's config at its first call (the
    config the engine is given is not yet the one it runs with)."""

    def __init__(self) -> None:
        self.manager = None
        self.register_s = 0.0

    def __call__(self, graph: torch.fx.Graph) -> None:
        if self.manager is None:
            from vllm.compilation.passes.fusion.add_rms_fusion import (
                AddRMSNormFusionPass,
                RMSNormReshapeFusionPass,
            )
            from vllm.compilation.passes.fusion.rms_quant_fusion import RMSNormQuantFusionPass
            from vllm.compilation.passes.pass_manager import PostGradPassManager

            config = ENGINE_CONFIG[0]
            start = time.perf_counter()
            self.manager = PostGradPassManager()
            self.manager.configure(config)  # on CPU: NoOpElimination and the fixed tail
            # the fusions it builds for the Transformers backend on CUDA, in its order (on
            # CPU pass_manager.py does not import them)
            from vllm.config import set_current_vllm_config

            with set_current_vllm_config(config, check_compile=False):
                for p in (AddRMSNormFusionPass, RMSNormReshapeFusionPass, RMSNormQuantFusionPass):
                    self.manager.add(p(config))
            self.register_s = time.perf_counter() - start
            BUILT.append(self)  # the engine deep-copies its config: this is its copy
        from vllm.compilation.passes.inductor_pass import pass_context
        from vllm.config.utils import Range

        # what vLLM's own backend sets around Inductor: the token counts compiled for (here
        # one dynamic graph for all)
        with pass_context(
            Range(start=1, end=ENGINE_CONFIG[0].scheduler_config.max_num_batched_tokens)
        ):
            self.manager(graph)

    def uuid(self) -> str:
        return "fxpass-test-post-grad-passes"


def main() -> int:
    import torch._inductor.config

    torch._inductor.config.force_disable_caches = True  # Inductor compiles (and runs the passes)
    model_dir, out = Path(sys.argv[2]), sys.argv[3]
    from vllm.platforms import current_platform

    current_platform.import_kernels()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import cpu_ops  # noqa: F401  (RMSNormQuantFusionPass's fused kernels, missing on CPU)

    if not (model_dir / "config.json").exists():
        build_model(model_dir)

    from vllm.platforms.cpu import CpuPlatform

    update = CpuPlatform.check_and_update_config.__func__

    def keep_ir_wrap(cls, vllm_config):
        update(cls, vllm_config)
        vllm_config.compilation_config.ir_enable_torch_wrap = True
        ENGINE_CONFIG[:] = [vllm_config]

    CpuPlatform.check_and_update_config = classmethod(keep_ir_wrap)

    from vllm import LLM, SamplingParams
    from vllm.compilation.passes.vllm_inductor_pass import get_match_table

    passes = PassManagerFromEngine()
    start = time.perf_counter()
    llm = LLM(
        model=str(model_dir),
        model_impl="transformers",
        dtype="bfloat16",
        max_model_len=128,
        max_num_seqs=2,
        seed=0,
        compilation_config={
            "mode": 3,
            "pass_config": {"eliminate_noops": True},
            "inductor_compile_config": {"post_grad_custom_post_pass": passes},
        },
    )
    startup = time.perf_counter() - start
    prompts = ["the cat sat on the mat", "a big red dog ran"]
    params = SamplingParams(temperature=0.0, max_tokens=8)
    outputs = llm.generate(prompts, params)
    result = {
        "tokens": [list(o.outputs[0].token_ids) for o in outputs],
        "match_table": get_match_table(),
        "passes": [type(p).__name__ for b in BUILT for p in b.manager.passes],
        "startup_s": startup,
        "register_s": sum(b.register_s for b in BUILT),
    }
    Path(out).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
