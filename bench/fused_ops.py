"""Fused norm ops against the unfused code they replace, eager and under torch.compile.

For each of ``fxpass.rms_norm``, ``fxpass.fused_add_rmsnorm`` and
``fxpass.fused_add_rmsnorm_quant``, time (median, same run, same inputs):

* ``eager``: the unfused PyTorch code (the ops the fusion passes match), op by op;
* ``fused``: the fxpass op (ATen's fused kernel or the reference on CPU, Triton on CUDA);
* ``inductor``: ``torch.compile`` (Inductor) of the same unfused code.

Each time is the fastest of ``--repeat`` (at least 5) batches, the three interleaved so a
busy machine slows them alike.

It prints each time and the ratios ``eager/fused`` (speed-up of fusing) and
``inductor/fused`` (>= 1 means the fused op is at least as fast as what Inductor makes of the
unfused code). On CUDA it also prints the fused op's achieved memory bandwidth as a fraction
of the device's peak (target: >= 0.8 at hidden sizes 4096-8192, and no slower than Inductor).
CPU always; CUDA when a GPU is present.

    python bench/fused_ops.py            # full sizes
    python bench/fused_ops.py --quick    # small sizes, a smoke test
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from _common import parser

import fxpass  # noqa: F401  (registers torch.ops.fxpass)
from fxpass.ops import kernel_for

OPS = torch.ops.fxpass
EPS = 1e-6


# ----- the unfused code, as models spell it --------------------------------------------------
def unfused_rms_norm(x, w):
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS)
    return (h * w.float()).to(x.dtype)


def unfused_add_rmsnorm(x, r, w):
    s = x + r
    return unfused_rms_norm(s, w), s


def unfused_add_rmsnorm_quant(x, r, w, scale):
    normed, s = unfused_add_rmsnorm(x, r, w)
    return torch.clamp(torch.round(normed.float() / scale), -128, 127).to(torch.int8), s


CASES = {
    "rms_norm": (
        unfused_rms_norm,
        lambda x, r, w, s: OPS.rms_norm(x, w, EPS),
        lambda x, r, w, s: (x, w),
        lambda n, b: 2 * n * b,  # read x, write out
    ),
    "fused_add_rmsnorm": (
        unfused_add_rmsnorm,
        lambda x, r, w, s: OPS.fused_add_rmsnorm(x, r, w, EPS),
        lambda x, r, w, s: (x, r, w),
        lambda n, b: 4 * n * b,  # read x, r; write normed, sum
    ),
    "fused_add_rmsnorm_quant": (
        unfused_add_rmsnorm_quant,
        lambda x, r, w, s: OPS.fused_add_rmsnorm_quant(x, r, w, s, EPS),
        lambda x, r, w, s: (x, r, w, s),
        lambda n, b: 3 * n * b + n,  # read x, r; write sum; write int8
    ),
}


# ----- timing -----------------------------------------------------------------------------------
def _time_all(fns: dict[str, Callable[[], object]], device: str, repeat: int) -> dict:
    """Seconds per call of each function: the fastest of ``repeat`` batches, the functions
    interleaved batch by batch so that a busy machine slows them alike."""
    for fn in fns.values():
        for _ in range(3):
            fn()
    best = dict.fromkeys(fns, float("inf"))
    inner = 20 if device == "cuda" else 5
    for _ in range(max(repeat, 5)):
        for name, fn in fns.items():
            if device == "cuda":
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(inner):
                    fn()
                end.record()
                torch.cuda.synchronize()
                took = start.elapsed_time(end) / 1e3
            else:
                t0 = time.perf_counter()
                for _ in range(inner):
                    fn()
                took = time.perf_counter() - t0
            best[name] = min(best[name], took / inner)
    return best


def peak_bandwidth() -> float | None:
    """The device's peak DRAM bandwidth in bytes/s (memory clock x bus width x 2)."""
    props = torch.cuda.get_device_properties(0)
    clock_khz = getattr(props, "memory_clock_rate", None)
    bus_bits = getattr(props, "memory_bus_width", None)
    if not (clock_khz and bus_bits):
        try:
            import triton

            info = triton.runtime.driver.active.utils.get_device_properties(0)
            clock_khz, bus_bits = info["mem_clock_rate"], info["mem_bus_width"]
        except Exception:
            return None
    return 2 * clock_khz * 1e3 * bus_bits / 8


def _compiled(fn: Callable) -> Callable | None:
    try:
        return torch.compile(fn, backend="inductor", dynamic=False)
    except Exception:  # no compiler toolchain: report n/a
        return None


def run_case(name: str, tokens: int, hidden: int, device: str, dtype, repeat: int, peak):
    unfused, fused, pick, nbytes = CASES[name]
    gen = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(tokens, hidden, generator=gen).to(device=device, dtype=dtype)
    r = torch.randn(tokens, hidden, generator=gen).to(device=device, dtype=dtype)
    w = (1 + 0.1 * torch.randn(hidden, generator=gen)).to(device=device, dtype=dtype)
    scale = torch.tensor([0.02], device=device)
    args = pick(x, r, w, scale)
    fns = {"eager": lambda: unfused(*args), "fused": lambda: fused(x, r, w, scale)}
    with torch.no_grad():
        compiled = _compiled(unfused)
        try:
            compiled(*args)
            fns["inductor"] = lambda: compiled(*args)
        except Exception:  # no compiler toolchain: report n/a
            pass
        times = _time_all(fns, device, repeat)
    eager, mine, inductor = times["eager"], times["fused"], times.get("inductor")
    row = {
        "op": name,
        "device": device,
        "kernel": kernel_for(x),
        "shape": f"{tokens}x{hidden}",
        "eager_ms": eager * 1e3,
        "fused_ms": mine * 1e3,
        "inductor_ms": inductor * 1e3 if inductor else None,
        "eager/fused": eager / mine,
        "inductor/fused": inductor / mine if inductor else None,
    }
    if device == "cuda":
        gbs = nbytes(tokens * hidden, x.element_size()) / mine
        row["GB/s"] = gbs / 1e9
        row["of_peak"] = gbs / peak if peak else None
    return row


def _fmt(v) -> str:
    if v is None:
        return "n/a"
    return f"{v:.3f}" if isinstance(v, float) else str(v)


def main(argv=None) -> int:
    p = parser(__doc__.split("\n\n")[0])
    args = p.parse_args(argv)
    torch._dynamo.config.cache_size_limit = 64
    plans = [("cpu", [(64, 1024)] if args.quick else [(256, 4096), (128, 8192)])]
    if torch.cuda.is_available():
        sizes = [(1024, 4096)] if args.quick else [(16384, 4096), (16384, 5120), (8192, 8192)]
        plans.append(("cuda", sizes))
    peak = peak_bandwidth() if torch.cuda.is_available() else None
    if peak:
        print(f"peak DRAM bandwidth of {torch.cuda.get_device_name(0)}: {peak / 1e9:.0f} GB/s")
    print(
        "ratios: eager/fused = speed-up from fusing; inductor/fused >= 1 means the fused op "
        "is at least as fast as Inductor's code for the unfused ops; of_peak = fraction of "
        "peak DRAM bandwidth (CUDA)"
    )
    rows = []
    for device, sizes in plans:
        for tokens, hidden in sizes:
            for name in CASES:
                row = run_case(name, tokens, hidden, device, torch.bfloat16, args.repeat, peak)
                rows.append(row)
                print("  ".join(f"{k}={_fmt(v)}" for k, v in row.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
