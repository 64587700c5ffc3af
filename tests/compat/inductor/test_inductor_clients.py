"""Client pass files written for Inductor's pattern matcher (vLLM's style, AutoDeploy's),
run unmodified against Inductor and against fxpass (``install()``) on tiny Hugging Face Llama
and Qwen3 graphs from torch.export and from AOTAutograd: the same matches, the same outputs.
With the improvements on, the sites Inductor's rules miss (no-op casts and views between the
ops, an intermediate with another user, export's asserts) are fused too."""

from __future__ import annotations

import pytest
import torch
from _captures import captured
from _ind_support import MATCHERS, close, load_client, same

import fxpass.compat.inductor as fxi

MODELS = ("hf_llama", "hf_qwen3")
IRS = ("aot", "export")
#: RMSNorms in the two-layer models: 4 after a residual add, and 1 (Llama) or 5 (Qwen3's
#: q/k norms and the first layer's) on a plain value.
NORMS = {"hf_llama": (4, 1), "hf_qwen3": (4, 5)}


@pytest.fixture(scope="module")
def vllm():
    """vLLM-style passes, one per matcher (registration traces once per pattern)."""
    return {m: load_client("_vllm_client.py", m) for m in MATCHERS}


def _run_pass(make, cap, *, improve=None):
    p = make()
    if improve is not None:
        p.patterns.improve = improve
    p(cap.gm.graph)
    return p


@pytest.fixture(scope="module")
def rms_passes(vllm):
    """Per dtype (float32, bfloat16), for the models' eps."""
    return {m: vllm[m].RMSNormFusionPass(epsilons=(1e-6,)) for m in MATCHERS}


@pytest.mark.parametrize("ir", IRS)
@pytest.mark.parametrize("model", MODELS)
def test_vllm_style_pass_matches_what_inductor_matches(rms_passes, model, ir):
    counts, outputs = {}, {}
    for m in MATCHERS:
        cap = captured(model, ir)
        p = rms_passes[m]
        p.patterns.improve = False if m == "fxpass" else None
        p(cap.gm.graph)
        counts[m] = p.matched_count
        outputs[m] = cap.run()
        assert close(outputs[m], cap.expected, 1e-4)
    assert counts["fxpass"] == counts["inductor"]
    assert same(outputs["fxpass"], outputs["inductor"])
    fused, plain = NORMS[model]
    # export's graphs keep no-op ``to`` casts and asserts between the ops: Inductor finds none
    assert counts["inductor"] == (fused + plain if ir == "aot" else 0)


@pytest.mark.parametrize("ir", IRS)
@pytest.mark.parametrize("model", MODELS)
def test_vllm_style_pass_with_improvements_fuses_every_norm(rms_passes, model, ir):
    cap = captured(model, ir)
    p = rms_passes["fxpass"]
    p.patterns.improve = True
    try:
        p(cap.gm.graph)
    finally:
        p.patterns.improve = False
    fused, plain = NORMS[model]
    assert p.matched_count == fused + plain
    assert p.patterns.stats.extra == (0 if ir == "aot" else fused + plain)
    graph = cap.gm.graph
    assert not graph.find_nodes(op="call_function", target=torch.ops.aten.rsqrt.default)
    assert close(cap.run(), cap.expected, 1e-4)


@pytest.mark.parametrize("ir", IRS)
@pytest.mark.parametrize("model", MODELS)
def test_an_intermediate_with_another_user_fuses_with_the_improvements(vllm, model, ir):
    """The sum feeds its norm and the next residual add: Inductor's rules take only the
    last layer's; the improvements take all, the replacement's own sum serving the add."""
    counts, outputs = {}, {}
    for label, m, improve in (("inductor", "inductor", None), ("fxpass", "fxpass", False)):
        cap = captured(model, ir)
        p = _run_pass(
            lambda m=m: vllm[m].AddRMSNormFusionPass(epsilons=(1e-6,)), cap, improve=improve
        )
        counts[label], outputs[label] = p.matched_count, cap.run()
    assert counts["fxpass"] == counts["inductor"] == (1 if ir == "aot" else 0)
    assert same(outputs["fxpass"], outputs["inductor"])
    cap = captured(model, ir)
    adds = len(cap.gm.graph.find_nodes(op="call_function", target=torch.ops.aten.add.Tensor))
    p = _run_pass(lambda: vllm["fxpass"].AddRMSNormFusionPass(epsilons=(1e-6,)), cap, improve=True)
    assert p.matched_count == 4
    assert p.patterns.stats.extra == 4 - counts["inductor"]
    # each site loses its ``mean + eps`` add; no residual sum is computed twice
    after = len(cap.gm.graph.find_nodes(op="call_function", target=torch.ops.aten.add.Tensor))
    assert after == adds - 4
    assert close(cap.run(), cap.expected, 1e-4)


@pytest.fixture(scope="module")
def autodeploy():
    return {m: load_client("_autodeploy_client.py", m) for m in MATCHERS}


@pytest.mark.parametrize("model", MODELS)
def test_autodeploy_style_transforms_match_what_inductor_matches(autodeploy, model):
    counts, outputs = {}, {}
    for m in MATCHERS:
        cap = captured(model, "aot")
        with fxi.improvements(False):
            counts[m] = (
                autodeploy[m].match_rms_norm(cap.gm.graph),
                autodeploy[m].fuse_add_rms_norm(cap.gm.graph),
            )
        outputs[m] = cap.run()
        assert close(outputs[m], cap.expected, 1e-4)
    fused, plain = NORMS[model]
    assert counts["fxpass"] == counts["inductor"] == (fused + plain, fused)
    assert same(outputs["fxpass"], outputs["inductor"])
    fused_op = torch.ops.fxpass.fused_add_rmsnorm.default
    assert len(cap.gm.graph.find_nodes(op="call_function", target=fused_op)) == fused


@pytest.mark.parametrize("model", MODELS)
def test_autodeploy_style_transforms_on_export_graphs_need_the_improvements(autodeploy, model):
    cap = captured(model, "export")
    client = autodeploy["fxpass"]
    with fxi.improvements(False):
        assert client.match_rms_norm(cap.gm.graph) == 0
    with fxi.improvements():
        assert client.match_rms_norm(cap.gm.graph) == sum(NORMS[model])
        assert client.fuse_add_rms_norm(cap.gm.graph) == NORMS[model][0]
    assert close(cap.run(), cap.expected, 1e-4)
