"""Analyses recomputed by the default pipeline, without and with the analysis manager's cache.

On the exported 128-layer Llama-style decoder (core ATen, ``run_decompositions()``, export's
asserts kept for ``remove_assert_ops``), run the default pipeline twice from the same graph:

* **before** — the manager computes every request (``ctx.analyses.cache = False``), which is
  what the library did before it had a manager: each pass built its own analyses;
* **after**  — the manager caches per graph, takes in the changes analyses can absorb, and
  keeps what each pass declares preserved.

Printed: passes x analyses (computed before; computed and served from the cache after), the
totals, the time of both runs and their ratio (target: no slowdown, ratio <= 1.05), and the
check that both runs made the same rewrites and the same graph, whose outputs are equal.

    python bench/analyses.py            # 128 layers
    python bench/analyses.py --quick    # 2 layers, a smoke test
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from _common import exported_decoder, parser, timeit

import fxpass as fp
from fxpass.core.snapshot import GraphSnapshot
from fxpass.verify.inputs import program_inputs

TARGET = 1.05


class _NoCache(fp.Instrumentation):
    """Turns the run's analysis cache off: every request is computed."""

    def before_pipeline(self, pipeline, gm, ctx):
        ctx.analyses.cache = False


def _run(gm, cache: bool, inputs=None):
    """Run the default pipeline on ``gm`` and put ``gm`` back; (report, code, outputs on
    ``inputs``)."""
    snapshot = GraphSnapshot.take(gm)
    try:
        result = fp.Pipeline(["default"]).run(gm, instrument=[] if cache else [_NoCache()])
        out = result.graph_module
        code = out.graph.python_code("self").src
        outputs = None
        if inputs is not None:
            out.recompile()
            with torch.no_grad():
                outputs = _flat(out(*inputs))
        return result.report, code, outputs
    finally:
        snapshot.restore()


def _timed(gm, cache: bool, repeat: int) -> float:
    return timeit(lambda: _run(gm, cache), repeat=repeat)


def _table(before: dict, after: dict) -> tuple[list[str], int, int, int]:
    lines = [f"  {'pass':<24} {'analysis':<12} {'before':>7} {'after':>6} {'served':>7}"]
    total_before = total_after = total_served = 0
    for name in dict.fromkeys([*before, *after]):
        for analysis in dict.fromkeys([*before.get(name, {}), *after.get(name, {})]):
            b = sum(before.get(name, {}).get(analysis, [0, 0]))
            a, served = after.get(name, {}).get(analysis, [0, 0])
            total_before, total_after, total_served = (
                total_before + b,
                total_after + a,
                total_served + served,
            )
            lines.append(f"  {name:<24} {analysis:<12} {b:>7} {a:>6} {served:>7}")
    return lines, total_before, total_after, total_served


def main(argv=None) -> int:
    args = parser(__doc__.splitlines()[0]).parse_args(argv)
    layers = 2 if args.quick else 128
    ep, _, inputs = exported_decoder(layers, remove_asserts=False)
    gm = ep.graph_module
    print(f"graph: {layers} layers, {len(gm.graph.nodes)} nodes, the default pipeline")

    flat = program_inputs(ep, inputs)
    report_before, code_before, out_before = _run(gm, False, flat)
    report_after, code_after, out_after = _run(gm, True, flat)

    lines, before, after, served = _table(
        report_before.analysis_counts(), report_after.analysis_counts()
    )
    print("passes x analyses: computed before; computed and served from the cache after")
    print("\n".join(lines))
    print(f"analyses computed: before {before}, after {after} ({served} served from the cache)")

    same_rewrites = _counts(report_before) == _counts(report_after)
    same_graph = code_before == code_after
    same_outputs = len(out_before) == len(out_after) and all(
        torch.equal(a, b) for a, b in zip(out_before, out_after)
    )
    print(f"same rewrites: {same_rewrites}, same graph: {same_graph}, same outputs: {same_outputs}")

    t_before = _timed(gm, False, args.repeat)
    t_after = _timed(gm, True, args.repeat)
    ratio = t_after / t_before
    print(f"default pipeline, every analysis computed: {t_before * 1e3:9.1f} ms")
    print(f"default pipeline, analyses cached:         {t_after * 1e3:9.1f} ms")
    print(f"ratio cached / computed:                   {ratio:9.3f}   (target <= {TARGET})")
    ok = same_rewrites and same_graph and same_outputs and after <= before
    print("PASS" if ok and ratio <= TARGET else "MISS")
    return 0 if ok else 1


def _counts(report) -> dict:
    """The statistics that count rewrites (not the per-rule timings)."""
    return {k: v for k, v in report.stats().items() if not k.endswith(".ms")}


def _flat(out):
    return list(out) if isinstance(out, (tuple, list)) else [out]


if __name__ == "__main__":
    raise SystemExit(main())
