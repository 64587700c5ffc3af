"""What users pay: each command's cost against an anchor measured in the same run.

Every row prints the measured ratio and its target; the performance tables of the docs
(docs/performance.md) are this command's output.

* ``(a) fuse_add_rmsnorm``: ``fp.Pipeline.parse("fuse_add_rmsnorm").run(gm)`` — checks,
  change detection, rollback, report — against a hand-written loop for the one spelling of
  an exported bf16 Llama-style decoder (``bench/rewrite.py``'s), graph surgery alone, at
  128 layers: warm (median of ``--repeat`` turns, the two alternating) and the first run in
  a fresh process (the program loaded from a ``.pt2``, untimed; the hand loop first, the
  pipeline second; best of ``--repeat`` processes). Target: within 2x. A line below the
  warm row splits it: the pass's function called alone, and the pipeline's own share.
* ``(b) no-op passes``: ``Pipeline.run`` of 20 passes that change nothing on the 128-layer
  graph (16k nodes), minus the same passes called in a plain loop, per pass, against one
  ``recompile()`` of that graph. Target: under 2%.
* ``(c) fxpass run``: ``fxpass run model.pt2 -p default -o out.pt2`` on a 64-layer program
  as a whole process, against a process that runs ``torch.export.load`` then
  ``torch.export.save`` of the same file. CPU time of the child processes (a shared
  machine's load does not count; wall time printed too), best of ``--repeat``. Target:
  within 1.5x.
* ``(d) fxpass shard``: ``fxpass.shard(program, tp=2)`` of a 64-layer float32 program —
  planning and both ranks' rewrites — against one ``torch.export.load`` of it. Target:
  under 1x.
* ``(e) ExecuTorch``: ``to_edge_transform_and_lower`` of a 16-layer decoder with
  ``fxpass.compat.executorch.install()`` against stock ExecuTorch (``bench/executorch.py``'s
  fresh processes, best of ``--repeat``). Target: at least 3x faster.

Times in-process are CPU time of the measuring thread (``time.thread_time``). The spread
printed is (slowest - fastest) / median of the runs of the measured side.

    python bench/cost.py                 # every row at the sizes above
    python bench/cost.py --rows a,b      # some rows
    python bench/cost.py --quick         # small sizes, one run each: a smoke test
"""

from __future__ import annotations

import copy
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from _common import exported_decoder, noop_returning_false, noop_returning_none, parser

import fxpass as fp

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
_clock = time.thread_time
ROWS = "abcde"


# ----- helpers ------------------------------------------------------------------------------
def _env() -> dict[str, str]:
    path = os.pathsep.join(p for p in [str(SRC), str(HERE), os.environ.get("PYTHONPATH")] if p)
    return {**os.environ, "PYTHONPATH": path}


def _child(args: list[str], cwd: Path) -> tuple[float, float, str]:
    """(CPU seconds, wall seconds, stdout) of one child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(args, capture_output=True, text=True, env=_env(), cwd=cwd, timeout=1800)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(args[:4])} failed:\n{proc.stderr[-4000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall, proc.stdout


def _cpu(fn: Callable[[], object]) -> float:
    gc.collect()
    gc.disable()
    try:
        t0 = _clock()
        fn()
        return _clock() - t0
    finally:
        gc.enable()


def _spread(times: list[float]) -> float:
    return (max(times) - min(times)) / statistics.median(times) if len(times) > 1 else 0.0


class Table:
    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str, float, str, bool]] = []

    def add(self, row: str, measured: str, anchor: str, ratio: float, target: str, ok: bool):
        self.rows.append((row, measured, anchor, ratio, target, ok))
        verdict = "meets" if ok else "MISSES"
        print(f"{row}: {measured}; anchor {anchor}; ratio {ratio:.3f} ({verdict} {target})")
        sys.stdout.flush()

    def print(self) -> None:
        print()
        print(f"{'row':44s} {'ratio':>8s}  {'target':10s} verdict")
        for row, _, _, ratio, target, ok in self.rows:
            print(f"{row:44s} {ratio:8.3f}  {target:10s} {'meets' if ok else 'MISSES'}")


# ----- (a) fuse_add_rmsnorm through Pipeline.run against a hand loop ------------------------
_FIRST_RUN = """
import copy, json, sys, time
sys.path.insert(0, sys.argv[2])
import torch
import fxpass as fp
from rewrite import _hand_loop
ep = torch.export.load(sys.argv[1])
gm_hand, gm_pipe = ep.graph_module, copy.deepcopy(ep.graph_module)
t0 = time.thread_time()
sites = _hand_loop(gm_hand)
t1 = time.thread_time()
result = fp.Pipeline.parse("fuse_add_rmsnorm").run(gm_pipe)
t2 = time.thread_time()
fused = sum(1 for n in gm_pipe.graph.nodes if n.target is torch.ops.fxpass.fused_add_rmsnorm.default)
assert fused == sites, (fused, sites)
print(json.dumps({"hand": t1 - t0, "pipeline": t2 - t1}))
"""


def row_a(table: Table, layers: int, repeat: int, tmp: Path) -> None:
    from rewrite import _hand_loop

    from fxpass.passes.fusion.fuse_add_rmsnorm import fuse_add_rmsnorm

    ep, _, _ = exported_decoder(layers)
    gm0 = ep.graph_module
    nodes = len(gm0.graph.nodes)
    pipe = fp.Pipeline.parse("fuse_add_rmsnorm")
    fused = torch.ops.fxpass.fused_add_rmsnorm.default
    hand, piped, alone = [], [], []
    for _ in range(repeat + 1):  # the first turn warms them up and is dropped
        gm = copy.deepcopy(gm0)
        hand.append(_cpu(lambda g=gm: _hand_loop(g)))
        gm = copy.deepcopy(gm0)
        alone.append(_cpu(lambda g=gm: fuse_add_rmsnorm(g)))  # the function, no pipeline
        gm = copy.deepcopy(gm0)
        piped.append(_cpu(lambda g=gm: pipe.run(g)))
        assert sum(1 for n in gm.graph.nodes if n.target is fused) == 2 * layers
    hand, piped, alone = hand[1:], piped[1:], alone[1:]
    h, p, a = statistics.median(hand), statistics.median(piped), statistics.median(alone)
    print(
        f"    of which the pass alone (its function called outside a pipeline): "
        f"{a * 1e3:.1f} ms = {a / h:.2f}x the hand loop; the pipeline's own share "
        f"{(p - a) * 1e3:.1f} ms = {(p - a) / h:.2f}x the hand loop"
    )
    table.add(
        f"(a) fuse_add_rmsnorm warm, {layers} layers",
        f"Pipeline.run {p * 1e3:.1f} ms (spread {_spread(piped):.0%}, {repeat} runs)",
        f"hand loop {h * 1e3:.1f} ms ({nodes} nodes)",
        p / h,
        "<= 2x",
        p / h <= 2.0,
    )
    path = tmp / f"decoder{layers}.pt2"
    torch.export.save(ep, path)
    firsts = []
    for _ in range(repeat):
        _, _, out = _child([sys.executable, "-c", _FIRST_RUN, str(path), str(HERE)], tmp)
        firsts.append(json.loads(out.strip().splitlines()[-1]))
    best = min(firsts, key=lambda r: r["pipeline"] / r["hand"])
    ratios = [r["pipeline"] / r["hand"] for r in firsts]
    table.add(
        f"(a) fuse_add_rmsnorm first run, {layers} layers",
        f"Pipeline.run {best['pipeline'] * 1e3:.1f} ms in a fresh process "
        f"(ratios {', '.join(f'{r:.2f}' for r in ratios)} over {repeat} processes)",
        f"hand loop {best['hand'] * 1e3:.1f} ms, same process",
        min(ratios),
        "<= 2x",
        min(ratios) <= 2.0,
    )


# ----- (b) no-op passes ---------------------------------------------------------------------


def row_b(table: Table, layers: int, repeat: int, passes: int = 20) -> None:
    ep, _, _ = exported_decoder(layers)
    gm = copy.deepcopy(ep.graph_module)
    nodes = len(gm.graph.nodes)
    noops = [noop_returning_none if i % 2 else noop_returning_false for i in range(passes)]
    pipe = fp.Pipeline(noops)  # the defaults users get: lint and checks on
    assert not pipe.run(gm).modified
    recompile, through, loop = [], [], []
    for _ in range(repeat):
        recompile.append(_cpu(lambda: torch.fx.GraphModule.recompile(gm)))
        through.append(_cpu(lambda: pipe.run(gm)))
        loop.append(_cpu(lambda: [p(gm) for p in noops]))
    r, t, lp = (statistics.median(x) for x in (recompile, through, loop))
    per_pass = max(t - lp, 0.0) / passes
    ratio = per_pass / r
    table.add(
        f"(b) {passes} no-op passes, {nodes} nodes",
        f"overhead {per_pass * 1e3:.2f} ms per pass (pipeline {t * 1e3:.1f} ms, loop "
        f"{lp * 1e3:.1f} ms; spread {_spread(through):.0%}, {repeat} runs)",
        f"recompile() {r * 1e3:.1f} ms",
        ratio,
        "< 0.02",
        ratio < 0.02,
    )


# ----- (c) fxpass run as a whole process ----------------------------------------------------
_LOAD_SAVE = """
import sys, torch
torch.export.save(torch.export.load(sys.argv[1]), sys.argv[2])
"""


def row_c(table: Table, layers: int, repeat: int, tmp: Path) -> None:
    ep, _, _ = exported_decoder(layers, remove_asserts=False)
    path = tmp / f"run{layers}.pt2"
    torch.export.save(ep, path)
    nodes = len(ep.graph.nodes)
    ours, anchor = [], []
    for _ in range(repeat):
        cmd = [sys.executable, "-m", "fxpass", "run", str(path), "-p", "default"]
        ours.append(_child([*cmd, "-o", str(tmp / "out.pt2")], tmp)[:2])
        anchor.append(
            _child([sys.executable, "-c", _LOAD_SAVE, str(path), str(tmp / "ls.pt2")], tmp)[:2]
        )
    o, a = min(c for c, _ in ours), min(c for c, _ in anchor)
    table.add(
        f"(c) fxpass run -p default, {layers} layers",
        f"{o:.2f} s CPU ({min(w for _, w in ours):.2f} s wall; spread "
        f"{_spread([c for c, _ in ours]):.0%}, best of {repeat} processes; {nodes} nodes)",
        f"load + save {a:.2f} s CPU ({min(w for _, w in anchor):.2f} s wall)",
        o / a,
        "<= 1.5x",
        o / a <= 1.5,
    )


# ----- (d) fxpass shard --tp 2 --------------------------------------------------------------
def row_d(table: Table, layers: int, repeat: int, tmp: Path) -> None:
    ep, _, _ = exported_decoder(layers, remove_asserts=False, dtype=torch.float32)
    path = tmp / f"shard{layers}.pt2"
    torch.export.save(ep, path)
    loads, shards = [], []
    for _ in range(repeat):
        loads.append(_cpu(lambda: torch.export.load(path)))
        program = torch.export.load(path)
        out: list = []
        shards.append(_cpu(lambda p=program, o=out: o.append(fp.shard(p, tp=2))))
        assert len(out[0]) == 2
    s, ld = statistics.median(shards), statistics.median(loads)
    table.add(
        f"(d) fxpass.shard tp=2, {layers} layers",
        f"plan + 2 rewrites {s * 1e3:.0f} ms (spread {_spread(shards):.0%}, {repeat} runs)",
        f"torch.export.load {ld * 1e3:.0f} ms",
        s / ld,
        "< 1x",
        s / ld < 1.0,
    )


# ----- (e) ExecuTorch with install() --------------------------------------------------------
def row_e(table: Table, layers: int, repeat: int, tmp: Path) -> None:
    import importlib.machinery
    import importlib.util

    elsewhere = [p for p in sys.path if p and Path(p).resolve() != HERE]
    if importlib.machinery.PathFinder.find_spec("executorch", elsewhere) is None:
        print("(e) skipped: ExecuTorch is not installed")
        return
    # bench/executorch.py, under another name (it would stand in for the package)
    spec = importlib.util.spec_from_file_location("_bench_executorch", HERE / "executorch.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    run_child = bench.run_child

    runs: dict[str, list[float]] = {"executorch": [], "fxpass": []}
    for i in range(repeat):
        for kind in runs:
            runs[kind].append(run_child(kind, layers, tmp, i)["cpu"])
    stock, ours = min(runs["executorch"]), min(runs["fxpass"])
    table.add(
        f"(e) ExecuTorch lowering, {layers} layers",
        f"with install() {ours:.2f} s CPU (spread {_spread(runs['fxpass']):.0%}, "
        f"best of {repeat} processes)",
        f"stock {stock:.2f} s CPU",
        stock / ours,
        ">= 3x faster",
        stock / ours >= 3.0,
    )


def main(argv=None) -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--rows", default=ROWS, help="which rows, e.g. a,b (default: all)")
    args = p.parse_args(argv)
    rows = set(args.rows.replace(",", ""))
    if not rows <= set(ROWS):
        p.error(f"--rows takes letters of {ROWS!r}, got {args.rows!r}")
    quick = args.quick
    repeat = 1 if quick else max(1, args.repeat)
    table = Table()
    print(f"torch {torch.__version__}, fxpass {fp.__version__}, {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        if "a" in rows:
            row_a(table, 2 if quick else 128, repeat, folder)
        if "b" in rows:
            row_b(table, 2 if quick else 128, repeat)
        if "c" in rows:
            row_c(table, 2 if quick else 64, repeat, folder)
        if "d" in rows:
            row_d(table, 2 if quick else 64, repeat, folder)
        if "e" in rows:
            row_e(table, 1 if quick else 16, repeat, folder)
    table.print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
