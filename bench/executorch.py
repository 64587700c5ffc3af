"""ExecuTorch's own lowering with and without fxpass.compat.executorch.install().

``to_edge_transform_and_lower`` of the embedded Llama-style decoder (float32, 16 layers) with
ExecuTorch's ``XnnpackPartitioner``: the Edge passes, XNNPACK's 17 passes on each delegate,
the partition fusion, the pass managers and their checks — ExecuTorch's code, with its pass
infrastructure from ExecuTorch (``executorch``) or from fxpass (``fxpass``: ``install()``
called before ExecuTorch is imported).

Each run is a fresh interpreter (``install()`` is process-wide and must precede the import),
timing the first lowering in it — what a user waits for — from the exported program to the
lowered program; the two kinds alternate ``--repeat`` times and the best of each counts.
Times are the CPU time of the child process (``time.process_time``), so other work on a
shared machine does not skew the ratio (the lowering runs single-threaded Python; wall time
is printed too). Each run then writes the program (``to_executorch().buffer``) and runs it in
ExecuTorch's runtime; the benchmark fails unless every run wrote the same bytes and got the
same outputs, bit for bit. Target: fxpass at least 3x faster end to end.

    python bench/executorch.py             # 16 layers, best of 3 runs each
    python bench/executorch.py --phases    # and the CPU time of each phase of the lowering
    python bench/executorch.py --quick     # 1 layer, one run each: a smoke test
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET = 3.0
KINDS = ("executorch", "fxpass")
#: (module[:class], function, phase): where the lowering spends its time (``--phases``)
PHASES = [
    ("torch.export:ExportedProgram", "run_decompositions", "torch's run_decompositions"),
    ("executorch.exir.program._program", "_generate_edge_program", "to_edge's Edge passes"),
    (
        "executorch.backends.xnnpack._passes:XNNPACKPassManager",
        "transform",
        "XNNPACK's passes on each delegate",
    ),
    ("executorch.exir.backend.backend_api", "_create_partitions", "fusing the partitions"),
    (
        "executorch.backends.xnnpack.partition.xnnpack_partitioner:XnnpackPartitioner",
        "partition",
        "XNNPACK's partitioner",
    ),
    ("torch._export.verifier:Verifier", "_check_graph_module", "the program verifiers"),
]
_GC = "(garbage collection)"
_CHILD = """
import json, sys, time
if sys.argv[1] == "fxpass":
    import fxpass.compat.executorch as fxet
    fxet.install()  # before ExecuTorch is imported
import torch
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir import to_edge_transform_and_lower
from executorch.runtime import Runtime

import executorch.exir.pass_base
from fxpass.models.llama import build_decoder

layers, out, phased = int(sys.argv[2]), sys.argv[3], sys.argv[4] == "phases"
spent = {}
if phased:  # CPU time per phase, each without the phases it calls
    import importlib
    stack = []

    def timed(owner, name, phase):
        fn = getattr(owner, name)

        def run(*args, **kwargs):
            t = time.process_time()
            stack.append(0.0)
            try:
                return fn(*args, **kwargs)
            finally:
                took, inner = time.process_time() - t, stack.pop()
                spent[phase] = spent.get(phase, 0.0) + took - inner
                if stack:
                    stack[-1] += took

        setattr(owner, name, run)

    for where, name, phase in PHASES:
        module, _, cls = where.partition(":")
        owner = importlib.import_module(module)
        timed(getattr(owner, cls) if cls else owner, name, phase)
    import gc
    collecting = []

    def collected(stage, info):  # the garbage collector's time, inside the phases
        if stage == "start":
            collecting.append(time.process_time())
        elif collecting:
            took = time.process_time() - collecting.pop()
            spent["(garbage collection)"] = spent.get("(garbage collection)", 0.0) + took
model = build_decoder(layers=layers, dtype=torch.float32)
inputs = model.example_inputs()
exported = torch.export.export(model, inputs)
if phased:
    spent.clear()
    gc.callbacks.append(collected)
wall, cpu = time.perf_counter(), time.process_time()
lowered = to_edge_transform_and_lower(exported, partitioner=[XnnpackPartitioner()])
cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
program = lowered.to_executorch().buffer
loaded = Runtime.get().load_program(program)  # a Method runs only while its Program lives
outputs = loaded.load_method("forward").execute(list(inputs))
with open(out + ".pte", "wb") as f:
    f.write(program)
torch.save([o.clone() for o in outputs], out + ".pt")
with torch.no_grad():
    eager = model(*inputs)
json.dump(
    {
        "cpu": cpu,
        "wall": wall,
        "base": executorch.exir.pass_base.ExportPass.__module__,
        "nodes": len(exported.graph.nodes),
        "delegates": sum(1 for n in lowered.exported_program().graph.nodes
                         if n.op == "call_function" and "delegate" in str(n.target)),
        "eager_error": float((outputs[0] - eager).abs().max()),
        "phases": spent,
    },
    open(out + ".json", "w"),
)
"""


def run_child(kind: str, layers: int, folder: Path, index: int, phases: bool = False) -> dict:
    """One lowering in a fresh interpreter; its measurements, program and outputs."""
    mode = "phases" if phases else "plain"
    out = folder / f"{kind}{index}"
    src = Path(__file__).resolve().parent.parent / "src"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")]),
    }
    child = f"PHASES = {PHASES!r}\n{_CHILD}"
    proc = subprocess.run(
        [sys.executable, "-c", child, kind, str(layers), str(out), mode],
        capture_output=True,
        text=True,
        env=env,
        cwd=folder,  # not bench/, where this file would stand in for the executorch package
        timeout=1800,
    )
    if proc.returncode != 0:
        raise SystemExit(f"the {kind} lowering failed:\n{proc.stderr[-4000:]}")
    result = json.loads(out.with_suffix(".json").read_text())
    result["program"] = out.with_suffix(".pte").read_bytes()
    result["outputs"] = out.with_suffix(".pt")
    return result


def same_outputs(a: Path, b: Path) -> bool:
    import torch

    x, y = torch.load(a), torch.load(b)
    return len(x) == len(y) and all(torch.equal(u, v) for u, v in zip(x, y))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="1 layer, one run each: a smoke test")
    p.add_argument("--repeat", type=int, default=3, help="runs of each kind (best counts)")
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--phases", action="store_true", help="CPU time per phase of the lowering")
    args = p.parse_args(argv)
    layers = 1 if args.quick else args.layers
    repeat = 1 if args.quick else max(1, args.repeat)
    runs: dict[str, list[dict]] = {kind: [] for kind in KINDS}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for i in range(repeat):
            for kind in KINDS:
                t0 = time.perf_counter()
                r = run_child(kind, layers, folder, i, args.phases)
                runs[kind].append(r)
                print(
                    f"  {kind:10s} run {i + 1}: lowering {r['cpu']:6.1f} s CPU "
                    f"({r['wall']:6.1f} s wall; whole run {time.perf_counter() - t0:5.1f} s)"
                )
        first = runs["executorch"][0]
        for kind in KINDS:
            for r in runs[kind]:
                if r["program"] != first["program"]:
                    raise SystemExit(f"{kind} wrote another program than ExecuTorch alone")
                if not same_outputs(r["outputs"], first["outputs"]):
                    raise SystemExit(f"{kind}'s program computed other outputs in the runtime")
        if runs["fxpass"][0]["base"] != "fxpass.compat.executorch._pass_base":
            raise SystemExit("install() did not give ExecuTorch fxpass's ExportPass")
    best = {kind: min(r["cpu"] for r in runs[kind]) for kind in KINDS}
    wall = {kind: min(r["wall"] for r in runs[kind]) for kind in KINDS}
    ratio = best["executorch"] / best["fxpass"]
    verdict = "meets" if ratio >= TARGET else "misses"
    print(
        f"to_edge_transform_and_lower, {layers}-layer decoder ({first['nodes']} nodes exported, "
        f"{first['delegates']} XNNPACK delegates), best of {repeat}:\n"
        f"  ExecuTorch {best['executorch']:6.1f} s CPU ({wall['executorch']:.1f} s wall)\n"
        f"  fxpass     {best['fxpass']:6.1f} s CPU ({wall['fxpass']:.1f} s wall)\n"
        f"  same program ({len(first['program']):,} bytes) and the same runtime outputs, "
        f"bit for bit (largest difference to eager: {first['eager_error']:.2g})\n"
        f"ratio {ratio:.2f}x end to end ({verdict} the {TARGET:.0f}x target)"
    )
    if args.phases:
        fastest = {kind: min(runs[kind], key=lambda r: r["cpu"]) for kind in KINDS}
        print("CPU time by phase, in the fastest run of each (s):")
        print(f"  {'phase':36s} {'ExecuTorch':>10s} {'fxpass':>8s}")
        for phase in [p for _, _, p in PHASES] + ["the rest"]:
            got = []
            for kind in KINDS:
                times = {k: v for k, v in fastest[kind]["phases"].items() if k != _GC}
                rest = fastest[kind]["cpu"] - sum(times.values())
                got.append(rest if phase == "the rest" else times.get(phase, 0.0))
            print(f"  {phase:36s} {got[0]:10.1f} {got[1]:8.1f}")
        gc_time = [fastest[kind]["phases"].get(_GC, 0.0) for kind in KINDS]
        print(f"  {'of all these, garbage collection':36s} {gc_time[0]:10.1f} {gc_time[1]:8.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
