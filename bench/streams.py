"""Multi-stream scheduling: the same graph on two CUDA streams against one, same outputs.

For the embedded decoder's MoE variant (routed + shared experts), its parallel-block
variant (GPT-J/Phi) and the plain decoder, export the model, schedule it with
``multi_stream{streams=2}``, prove the schedule with ``check_streams``, and check that the
scheduled graph computes exactly what the original does — eagerly, and under the CPU debug
mode that holds back each stream's kernels as long as the events allow (``stream_debug``,
both holds), where a race would give wrong outputs.

On CUDA it then times both graphs with CUDA events (median of ``--repeat`` batches, the two
interleaved), eagerly and as captured CUDA graphs (the schedule's events become graph edges;
launch overhead, which hides overlap in eager mode, is gone), and prints the ratio
``one stream / two streams`` (> 1: the second stream pays). Without a GPU it says so and
runs the CPU part only: correctness, and the overhead of the stream ops (no-ops on CPU) as
a ratio to the unscheduled graph.

    python bench/streams.py            # GPU-sized models where CUDA is present
    python bench/streams.py --quick    # tiny models, a smoke test
"""

from __future__ import annotations

import copy
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from _common import parser

import fxpass as fp
from fxpass.models.llama import build_decoder
from fxpass.ops.stream import is_stream_op
from fxpass.ops.stream_debug import stream_debug
from fxpass.verify import check_streams

MODELS = {
    "moe": {"moe_experts": 8, "moe_top_k": 2},
    "parallel": {"parallel_block": True},
    "decoder": {},
}
GPU_SIZE = {"layers": 4, "hidden": 1024, "heads": 16, "kv_heads": 16, "intermediate": 2816,
            "seq_len": 16}  # fmt: skip


def _schedule(name: str, size: dict, device: str):
    model = build_decoder(**MODELS[name], **size).to(device)
    (ids,) = model.example_inputs()
    ids = ids.to(device)
    with torch.no_grad():
        base = torch.export.export(model, (ids,)).run_decompositions().module()
    scheduled = copy.deepcopy(base)
    result = fp.apply(scheduled, "remove_assert_ops,multi_stream{streams=2}")
    fp.apply(base, "remove_assert_ops")
    stats = result.report.root.children[-1].stats
    return base, scheduled, ids, stats


def _check(name: str, base, scheduled, ids, stats) -> None:
    problems = check_streams(scheduled)
    with torch.no_grad():
        want = base(ids)
        same = torch.equal(want, scheduled(ids))
    if ids.device.type == "cpu":
        for hold in ("side", "main"):
            with stream_debug(hold) as debug:
                same = same and torch.equal(want, scheduled(ids)) and not debug.stale_reads
    ops = sum(1 for n in scheduled.graph.nodes if is_stream_op(n))
    print(
        f"{name}: {stats.get('regions_split', 0)} regions on 2 streams, "
        f"{stats.get('side_kernels', 0)} kernels on stream 1, {ops} stream ops; "
        f"check_streams: {'safe' if not problems else problems[0]}; "
        f"outputs {'equal' if same else 'DIFFER'} (eager and stream_debug)",
        flush=True,
    )
    if problems or not same:
        raise SystemExit(f"{name}: the scheduled graph is wrong")


def _cpu_overhead(base, scheduled, ids, repeat: int, calls: int) -> float:
    def run(fn):
        with torch.no_grad():
            t0 = time.perf_counter()
            for _ in range(calls):
                fn(ids)
            return time.perf_counter() - t0

    one, two = [], []
    for _ in range(repeat):
        one.append(run(base))
        two.append(run(scheduled))
    return statistics.median(two) / statistics.median(one)


# ----- CUDA -------------------------------------------------------------------------------------
def _cuda_time(fn: Callable[[], object], iters: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def _captured(gm, ids) -> Callable[[], object]:
    """``gm`` captured as a CUDA graph; the returned function replays it (outputs static)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        for _ in range(3):  # warm up: allocator pools, side streams and events exist
            gm(ids)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        out = gm(ids)
    return lambda: (graph.replay(), out)[1]


def _cuda_rows(name: str, base, scheduled, ids, repeat: int) -> None:
    iters = 20
    with torch.no_grad():
        eager = [
            (_cuda_time(lambda: base(ids), iters), _cuda_time(lambda: scheduled(ids), iters))
            for _ in range(max(repeat, 5))
        ]
    one, two = (statistics.median(t) for t in zip(*eager))
    print(f"{name} eager: one stream {one:.3f} ms, two streams {two:.3f} ms, "
          f"ratio one/two {one / two:.2f}x", flush=True)  # fmt: skip
    run_base, run_two = _captured(base, ids), _captured(scheduled, ids)
    same = torch.equal(run_base(), run_two())
    graphs = [(_cuda_time(run_base, iters), _cuda_time(run_two, iters)) for _ in range(repeat)]
    one, two = (statistics.median(t) for t in zip(*graphs))
    print(f"{name} CUDA graph: one stream {one:.3f} ms, two streams {two:.3f} ms, "
          f"ratio one/two {one / two:.2f}x, captured outputs {'equal' if same else 'DIFFER'}",
          flush=True)  # fmt: skip
    if not same:
        raise SystemExit(f"{name}: the captured scheduled graph computes something else")


def main(argv=None) -> int:
    args = parser(__doc__.split("\n\n")[0]).parse_args(argv)
    cuda = torch.cuda.is_available()
    if not cuda:
        print("no CUDA device: running the CPU part (schedule, check, equal outputs, overhead)")
    tiny = {"layers": 1} if args.quick else {"layers": 2}
    for name in MODELS:
        base, scheduled, ids, stats = _schedule(name, tiny, "cpu")
        _check(name, base, scheduled, ids, stats)
        calls = 3 if args.quick else 20
        ratio = _cpu_overhead(base, scheduled, ids, max(args.repeat, 1 if args.quick else 5), calls)
        print(f"{name} cpu: scheduled/unscheduled time ratio {ratio:.2f} "
              "(stream ops are no-ops on CPU: their overhead)", flush=True)  # fmt: skip
    if cuda:
        size = tiny if args.quick else GPU_SIZE
        print(f"CUDA: {torch.cuda.get_device_name(0)}, model size {size}")
        for name in MODELS:
            base, scheduled, ids, stats = _schedule(name, size, "cuda")
            _check(name, base, scheduled, ids, stats)
            _cuda_rows(name, base, scheduled, ids, args.repeat)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
