"""Inductor's pattern matcher against fxpass's drop-in: ``register_replacement`` + ``apply``.

The same client code — a multi-output residual add + RMSNorm -> ``fxpass::fused_add_rmsnorm``
replacement registered with ``register_replacement(search, replace, examples, fwd_only,
pass)`` (vLLM's pattern), and a graph pattern with a handler using
``match.replace_by_example`` (AutoDeploy's) — is run with
``torch._inductor.pattern_matcher`` and with ``fxpass.compat.inductor``, on exported
Llama-style decoders (``fxpass.models.llama.build_decoder``, bf16, core ATen, export's
asserts removed; their ``_to_copy`` casts spelled ``prims.convert_element_type``, as
Inductor's patterns are traced, untimed) of 16, 64 and 128 layers. Both must find the same
sites and compute the same output, bit for bit.

Times: ``register`` is the registration of the patterns (fxpass traces each function once,
with symbolic sizes; Inductor traces the search function once), ``apply`` one
``PatternMatcherPass.apply`` on a fresh copy of the graph (Inductor re-traces both functions
at every match; fxpass replays its traces), median of ``--repeat`` runs. Target: fxpass's
apply at least 50x faster than Inductor's at 128 layers.

    python bench/inductor.py            # 16, 64, 128 layers
    python bench/inductor.py --quick    # 1, 2 layers (a smoke test)
    python bench/inductor.py --vllm     # vLLM's own passes too (builds .venv-vllm first)

``--vllm`` adds vLLM 0.32.0's real ``AddRMSNormFusionPass`` + ``RMSNormReshapeFusionPass`` and
``RMSNormQuantFusionPass`` (``bench/_vllm_passes.py``, run in the vLLM environment of
``tools/vllm_env.py``, once on stock Inductor and once after ``install()``) on Inductor's post-grad graphs of 16/64/128
layers: the same matches and post-pass ops both ways, registration (the passes' construction,
as at every vLLM start-up) and apply timed.
"""

from __future__ import annotations

import copy
import functools
import gc
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from _common import exported_decoder, parser, run_exported, to_inductor_dialect

import fxpass.compat.inductor as fxi
import fxpass.ops  # noqa: F401  (registers torch.ops.fxpass)

aten = torch.ops.aten
prims = torch.ops.prims
FUSED = torch.ops.fxpass.fused_add_rmsnorm.default
TARGET = 50.0
VLLM_TARGET = 10.0  # registration + apply of vLLM's passes at the largest size
EPS = 1e-6


def _search(x, residual, weight):
    s = x + residual
    h = s.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS)
    return weight * h.to(x.dtype), s


def _replace(x, residual, weight):
    out = FUSED(x, residual, weight, EPS, 0.0)
    return out[0], out[1]


def _register(pm, hidden: int):
    """The client code: both patterns, registered with ``pm`` (a pattern-matcher module)."""
    replacement = pm.PatternMatcherPass(pass_name="bench_register_replacement")
    bf = torch.bfloat16
    examples = [torch.empty(1, 8, hidden, dtype=bf), torch.empty(1, 8, hidden, dtype=bf)]
    examples.append(torch.empty(hidden, dtype=bf))
    pm.register_replacement(_search, _replace, examples, pm.fwd_only, replacement)

    graph = pm.PatternMatcherPass(pass_name="bench_graph_pattern")
    h = pm.CallFunction(
        prims.convert_element_type.default, pm.KeywordArg("x"), torch.float32, _users=2
    )
    var = pm.CallFunction(aten.mean.dim, pm.CallFunction(aten.pow.Tensor_Scalar, h, 2), [-1], True)
    normed = pm.CallFunction(
        aten.mul.Tensor,
        h,
        pm.CallFunction(
            aten.rsqrt.default, pm.CallFunction(aten.add.Tensor, var, pm.KeywordArg("eps"))
        ),
    )
    out = pm.CallFunction(
        aten.mul.Tensor,
        pm.KeywordArg("weight"),
        pm.CallFunction(prims.convert_element_type.default, normed, torch.bfloat16),
    )

    @pm.register_graph_pattern(out, pass_dict=graph)
    def _norm(match, x, weight, eps):
        def rms(x, weight):
            return torch.ops.fxpass.rms_norm(x, weight, eps)

        match.replace_by_example(rms, [x, weight])

    return replacement, graph


def _timed(fn):
    gc.collect()
    gc.disable()
    try:
        t0 = time.perf_counter()
        out = fn()
        return time.perf_counter() - t0, out
    finally:
        gc.enable()


def _apply(passes, gm):
    replacement, graph = passes
    return replacement.apply(gm.graph), graph.apply(gm.graph)


def _measure(pm, gm0, hidden, repeat):
    """(register s, apply s, (replacement matches, graph-pattern matches), rewritten gm)."""
    registers, applies = [], []
    counts = gm = None
    for _ in range(repeat):
        t_reg, passes = _timed(lambda: _register(pm, hidden))
        gm = copy.deepcopy(gm0)
        t_app, counts = _timed(functools.partial(_apply, passes, gm))
        registers.append(t_reg)
        applies.append(t_app)
    return statistics.median(registers), statistics.median(applies), counts, gm


def _vllm_section(layers) -> None:
    """vLLM's own passes, stock vs fxpass, in the vLLM environment (see the docstring)."""
    import json
    import subprocess
    import tempfile

    root = Path(__file__).resolve().parent.parent
    sys.path.insert(0, str(root / "tools"))
    import vllm_env

    try:
        python = vllm_env.build()
    except (subprocess.CalledProcessError, OSError) as e:
        print(f"\nvLLM's passes: skipped, the vLLM environment could not be installed ({e})")
        return
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("stock", "fxpass"):
            out = Path(tmp) / f"{mode}.json"
            script = str(root / "bench" / "_vllm_passes.py")
            cmd = [str(python), script, mode, str(out), *map(str, layers)]
            subprocess.run(cmd, check=True, cwd=root, stderr=subprocess.DEVNULL)
            runs[mode] = json.loads(out.read_text())
    print()
    print(
        "vLLM 0.32.0's own passes, stock Inductor vs fxpass: CPU ms of the process, best of "
        "runs (2 up to 64 layers, 1 above); wall-clock total ratio last"
    )
    print(
        f"{'bench':>9} {'layers':>6} {'matches':>7} {'ind. register':>14} {'fx register':>12} "
        f"{'ind. apply':>11} {'fx apply':>9} {'CPU ratio':>10} {'wall ratio':>11}"
    )
    for st, fx in zip(runs["stock"], runs["fxpass"]):
        assert st["matched"] == fx["matched"] and st["ops"] == fx["ops"], (st, fx)
        ratio = (st["register_cpu"] + st["apply_cpu"]) / (fx["register_cpu"] + fx["apply_cpu"])
        wall = (st["register"] + st["apply"]) / (fx["register"] + fx["apply"])
        matched = sum(st["matched"].values())
        print(
            f"{st['bench']:>9} {st['layers']:>6} {matched:>7} {st['register_cpu'] * 1e3:>14.1f} "
            f"{fx['register_cpu'] * 1e3:>12.1f} {st['apply_cpu'] * 1e3:>11.1f} "
            f"{fx['apply_cpu'] * 1e3:>9.1f} {ratio:>9.1f}x {wall:>10.1f}x"
        )
        for mode, row in (("stock", st), ("fxpass", fx)):
            spread = {k: [round(v, 3) for v in vs] for k, vs in row["runs"].items()}
            print(f"{'':>9} {'':>6} {mode:>7} runs (s): {spread}")
    last = [fx for fx in runs["fxpass"] if fx["layers"] == max(layers)]
    for fx in last:
        st = next(
            s for s in runs["stock"] if s["bench"] == fx["bench"] and s["layers"] == fx["layers"]
        )
        ratio = (st["register_cpu"] + st["apply_cpu"]) / (fx["register_cpu"] + fx["apply_cpu"])
        verdict = "met" if ratio >= VLLM_TARGET else "MISSED"
        if fx["layers"] < 128:
            verdict = "not judged below 128 layers"
        print(
            f"{fx['bench']} at {fx['layers']} layers: registration + apply {ratio:.1f}x "
            f"faster (CPU; target >= {VLLM_TARGET:.0f}x: {verdict})"
        )


def main(argv=None) -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--vllm", action="store_true", help="vLLM's own passes too (.venv-vllm)")
    args = p.parse_args(argv)
    layers = [1, 2] if args.quick else [16, 64, 128]
    if args.vllm:
        _vllm_section(layers)
    import torch._inductor.pattern_matcher as inductor

    matchers = {"inductor": inductor, "fxpass": fxi}
    rows = []
    for n_layers in layers:
        ep, model, inputs = exported_decoder(n_layers)
        gm0 = to_inductor_dialect(copy.deepcopy(ep.graph_module))
        hidden = model.cfg.hidden if hasattr(model, "cfg") else 64
        results, outputs = {}, {}
        for name, pm in matchers.items():
            reg, app, counts, gm = _measure(pm, gm0, hidden, args.repeat)
            results[name] = (reg, app, counts)
            outputs[name] = run_exported(ep, gm, inputs)
        assert results["fxpass"][2] == results["inductor"][2], f"{n_layers} layers: {results}"
        assert torch.equal(outputs["fxpass"], outputs["inductor"]), (
            f"{n_layers} layers: outputs differ"
        )
        reference = run_exported(ep, copy.deepcopy(ep.graph_module), inputs)
        drift = (
            (outputs["fxpass"].float() - reference.float()).norm() / reference.float().norm()
        ).item()
        rows.append((n_layers, len(gm0.graph.nodes), results, drift))
        print(f"{n_layers} layers: same matches {results['fxpass'][2]}, outputs equal", flush=True)
    return _report(rows, args.quick)


def _report(rows, quick: bool) -> int:
    print()
    print("ms (median); matches = (register_replacement sites, graph-pattern sites)")
    print(
        f"{'layers':>6} {'nodes':>6} {'matches':>9} {'ind. register':>14} {'fx register':>12} "
        f"{'ind. apply':>11} {'fx apply':>9} {'apply ratio':>12} {'total ratio':>12}"
    )
    for n_layers, nodes, res, _ in rows:
        (ir, ia, counts), (fr, fa, _) = res["inductor"], res["fxpass"]
        print(
            f"{n_layers:>6} {nodes:>6} {counts!s:>9} {ir * 1e3:>14.1f} {fr * 1e3:>12.1f} "
            f"{ia * 1e3:>11.1f} {fa * 1e3:>9.1f} {ia / fa:>11.1f}x {(ir + ia) / (fr + fa):>11.1f}x"
        )
    n_layers, nodes, res, drift = rows[-1]
    ratio = res["inductor"][1] / res["fxpass"][1]
    print()
    print(
        f"apply ratio at {n_layers} layers ({nodes} nodes): {ratio:.1f}x (target >= {TARGET:.0f}x)"
    )
    print(f"relative difference of the fused output from the unfused graph: {drift:.2e}")
    if quick:
        print("(quick run: small sizes, target not judged)")
        return 0
    ok = ratio >= TARGET
    print("target met" if ok else "TARGET MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
