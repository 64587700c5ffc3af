"""fuse_rmsnorm: every family's spelling, in every IR and dtype, fused; look-alikes left alone."""

from __future__ import annotations

import functools

import pytest
import torch
from _fusion_helpers import (
    LOOKALIKES,
    NORMS,
    Block,
    Captured,
    GemmaRMSNorm,
    LlamaRMSNorm,
    assert_close,
    compiled_matches_eager,
    count,
    inputs,
    new_nodes,
)

import fxpass as fp
from fxpass.fxutil.fx_internals import copy_sharing_specs
from fxpass.passes.fusion.fuse_rmsnorm import RULES, fuse_rmsnorm
from fxpass.rewrite import explain
from fxpass.rewrite.constraint import value_of

from _models import ASSERT, decoder, exported

F = torch.ops.fxpass
RMS = F.rms_norm.default


def _block(norm, qk_norm=False):
    return functools.partial(Block, NORMS[norm] if isinstance(norm, str) else norm, qk_norm=qk_norm)


_FACTORIES = {name: _block(name) for name in NORMS}
_FACTORIES["llama_qk"] = _block("llama", qk_norm=True)
_FACTORIES["gemma_qk"] = _block("gemma", qk_norm=True)


@pytest.mark.parametrize("family", sorted(NORMS))
@pytest.mark.parametrize("ir", ["export", "export_raw", "aot", "dynamo"])
def test_every_spelling_in_every_ir(family, ir):
    cap = Captured(_FACTORIES[family], ir)
    expected = cap.run()
    assert fp.Pipeline(["fuse_rmsnorm"]).run(cap.gm).modified
    assert count(cap.gm, RMS) == 3
    assert_close(cap.run(), expected, torch.bfloat16)
    cap.gm.graph.lint()


@pytest.mark.parametrize("family", ["llama_qk", "gemma_qk"])
@pytest.mark.parametrize("ir", ["export", "dynamo"])
def test_per_head_qk_norms(family, ir):
    cap = Captured(_FACTORIES[family], ir)
    expected = cap.run()
    fuse_rmsnorm(cap.gm)
    assert count(cap.gm, RMS) == 4  # three hidden-size norms and one over head_dim
    widths = sorted(value_of(n.args[1]).shape[0] for n in cap.gm.graph.nodes if n.target is RMS)
    assert widths == [8, 32, 32, 32]
    assert_close(cap.run(), expected, torch.bfloat16)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("family", ["llama", "gemma", "plain"])
def test_every_dtype(dtype, family):
    cap = Captured(_FACTORIES[family], "export", dtype)
    expected = cap.run()
    fuse_rmsnorm(cap.gm)
    assert count(cap.gm, RMS) == 3
    assert_close(cap.run(), expected, dtype)


@pytest.mark.parametrize(
    "config",
    [
        {},
        {"norm_style": "gemma"},
        {"norm_style": "plain"},
        {"qk_norm": True},
        {"eps": 1e-5},  # Phi-3
        {"norm_style": "gemma", "qk_norm": True, "sandwich_norm": True},
    ],
)
def test_decoder_norms_all_fused_with_their_eps_and_offset(config):
    ep = exported(**config)
    (ids,) = decoder(**config).example_inputs()
    expected = ep.module()(ids)
    result = fp.Pipeline(["fuse_rmsnorm"]).run(ep.graph_module)
    layers = 2
    norms = 2 * layers + 1 + (2 * layers if config.get("qk_norm") else 0)
    norms += 2 * layers if config.get("sandwich_norm") else 0
    fused = [n for n in ep.graph_module.graph.nodes if n.target is RMS]
    assert len(fused) == norms == result.report.stats()["fuse_rmsnorm.rewrites"]
    assert {n.args[2] for n in fused} == {config.get("eps", 1e-6)}
    offset = 1.0 if config.get("norm_style") == "gemma" else 0.0
    assert {n.args[3] for n in fused} == {offset}
    if "norm_style" not in config:  # Llama's norms carry export's asserts: gone with them
        assert count(ep.graph_module, ASSERT) < count(exported(**config).graph_module, ASSERT)
    assert_close(ep.module()(ids), expected, torch.bfloat16)


def test_new_nodes_carry_values_and_provenance():
    ep = exported()
    fuse_rmsnorm(ep.graph_module)
    made = new_nodes(ep.graph_module)
    assert len(made) == 5
    for n in made:
        assert isinstance(n.meta["val"], torch.Tensor)
        assert "layernorm" in str(n.meta["nn_module_stack"]) or "norm" in str(
            n.meta["nn_module_stack"]
        )
        assert "llama.py" in n.meta["stack_trace"]
        prov = n.meta["fxpass_provenance"]
        assert prov["rule"] == "rms_norm" and prov["pass"] == "fuse_rmsnorm"
        assert "fuse_rmsnorm.py" in prov["location"] and len(prov["replaced"]) >= 7
        assert n.meta["from_node"][0].pass_name == "fuse_rmsnorm"


@pytest.mark.parametrize("kind", sorted(LOOKALIKES))
@pytest.mark.parametrize("ir", ["export", "export_raw", "dynamo"])
def test_lookalikes_are_left_alone(kind, ir):
    cap = Captured(_block(LOOKALIKES[kind]), ir)
    before = len(cap.gm.graph.nodes)
    assert not fp.Pipeline(["fuse_rmsnorm"]).run(cap.gm).modified
    assert count(cap.gm, RMS) == 0 and len(cap.gm.graph.nodes) == before


def test_explain_says_why_a_lookalike_is_not_a_norm():
    cap = Captured(_block(LOOKALIKES["other_dim"]), "export")
    why = explain(RULES["rms_norm"], cap.gm)
    assert not why.matches and why.candidates
    assert "where" in str(why)  # the mean is over dimension 1: the norm check says no
    cap = Captured(_block(LOOKALIKES["cube"]), "export")
    assert "literal differs" in str(explain(RULES, cap.gm))


def test_runs_only_once_per_norm():
    cap = Captured(_FACTORIES["gemma"], "export")
    fuse_rmsnorm(cap.gm)
    assert not fuse_rmsnorm(cap.gm)  # its own op is not a norm to fuse again


def test_llama_and_gemma_norm_modules_alone():
    for norm, offset in ((LlamaRMSNorm, 0.0), (GemmaRMSNorm, 1.0)):
        model = norm(16).to(torch.bfloat16).eval()
        x = torch.randn(3, 16, dtype=torch.bfloat16)
        ep = torch.export.export(model, (x,)).run_decompositions()
        fuse_rmsnorm(ep.graph_module)
        (node,) = [n for n in ep.graph_module.graph.nodes if n.target is RMS]
        assert node.args[3] == offset
        assert_close(ep.module()(x), model(x), torch.bfloat16)


def test_same_outputs_under_torch_compile():
    """Inside Inductor (its post-grad ATen graph), per-head q/k norms included."""
    model = _FACTORIES["llama_qk"]().eval()
    stats = compiled_matches_eager(model, inputs(torch.float32), "fuse_rmsnorm")
    assert stats["fuse_rmsnorm.rewrites"] == 4


def _norm_sites(model, args) -> tuple[int, int]:
    """(RMSNorm modules executed with a weight, without one) in an eager run of ``model``."""
    seen: list[bool] = []
    hooks = [
        m.register_forward_hook(lambda mod, i, o: seen.append(getattr(mod, "with_scale", True)))
        for m in model.modules()
        if type(m).__name__.endswith("RMSNorm")
    ]
    with torch.no_grad():
        model(*args)
    for h in hooks:
        h.remove()
    return sum(seen), len(seen) - sum(seen)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("family", ["gemma3n", "gemma4"])
def test_pow_spelled_families_fused_at_every_site(family, dtype):
    """Gemma3n and Gemma4 spell the norm ``x * pow(mean(x**2) + eps, -0.5)``: every site with
    a weight is fused, counted by the norm modules an eager run executes (Gemma3n's router
    norm runs twice), in the graph export gives, in core ATen and in Dynamo's. The value
    norms have no weight (``with_scale=False``): ``fxpass::rms_norm`` takes one, so they
    stay as they are."""
    import _hf
    from _captures import _leaves, dynamo_capture

    model = _hf.model(family, dtype=dtype)
    ids = _hf.example_inputs()
    weighted, unweighted = _norm_sites(model, ids)
    assert weighted >= 16 and unweighted == 2
    with torch.no_grad():
        expected = _leaves(model(*ids))
    ep = torch.export.export(model, ids, strict=False)
    graphs = {"export": ep, "export_aten": copy_sharing_specs(ep).run_decompositions()}
    for ir, program in graphs.items():
        result = fp.Pipeline(["fuse_rmsnorm"]).run(program.graph_module)
        assert count(program.graph_module, RMS) == weighted, ir
        assert result.report.stats()["fuse_rmsnorm.rewrites"] == weighted
        for got, want in zip(_leaves(program.module()(*ids)), expected):
            assert_close(got, want, dtype)
    gm, real = dynamo_capture(model, ids, "dynamo")
    fuse_rmsnorm(gm)
    gm.recompile()
    assert count(gm, RMS) == weighted
    with torch.no_grad():
        for got, want in zip(_leaves(gm(*real)), expected):
            assert_close(got, want, dtype)


def _chain_then_norm(length: int, link) -> tuple[torch.fx.GraphModule, torch.Tensor, torch.Tensor]:
    """A graph of ``length`` nodes made by ``link(node, i) -> (target, args)`` between the
    input and a Llama RMSNorm (fake values computed once per distinct link: the links
    repeat, and 3000 fake calls take seconds)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    x, w = torch.randn(6, 8), torch.randn(8)
    gm = make_fx(lambda x, w: LlamaRMSNorm.forward(_WithWeight(w), x), tracing_mode="fake")(x, w)
    graph = gm.graph
    xin = next(iter(graph.find_nodes(op="placeholder")))
    users = list(xin.users)
    mode = xin.meta["val"].fake_mode
    prev, vals = xin, {}
    first = next(n for n in graph.nodes if n.op != "placeholder")
    with graph.inserting_before(first), mode:
        for i in range(length):
            target, args = link(prev, i)
            node = graph.call_function(target, args)
            key = (target, str(args[1:]))  # the links repeat: compute each value once
            if key not in vals:
                vals[key] = target(*(a.meta["val"] if hasattr(a, "meta") else a for a in args))
            node.meta["val"] = vals[key]
            prev = node
    for u in users:
        u.replace_input_with(xin, prev)
    gm.recompile()
    return gm, x, w


class _WithWeight:
    def __init__(self, w):
        self.weight, self.variance_epsilon = w, 1e-6


_LINKS = {
    "adds": lambda node, i: (torch.ops.aten.add.Tensor, (node, 1.0)),
    "views": lambda node, i: (torch.ops.aten.view.default, (node, [6, 8] if i % 2 else [2, 3, 8])),
}


@pytest.mark.parametrize("link", sorted(_LINKS))
def test_a_norm_after_a_chain_of_3000_nodes(link):
    """No recursion along a deep graph: the matcher, ``P.through`` (3000 views in front of
    the norm) and the rewriter stop at what the pattern needs."""
    gm, x, w = _chain_then_norm(3000, _LINKS[link])
    expected = gm(x, w)
    assert fp.Pipeline(["fuse_rmsnorm"]).run(gm).report.stats()["fuse_rmsnorm.rewrites"] == 1
    gm.graph.lint()
    torch.testing.assert_close(gm(x, w), expected, rtol=1e-5, atol=1e-5)
