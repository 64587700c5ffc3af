"""Compile overhead: torch.compile with backend="fxpass" against backend="inductor".

``backend="fxpass"`` runs the registered ``default`` pipeline on the ATen graphs Inductor
compiles, then Inductor; ``backend="inductor"`` is Inductor alone. Both compile the same
Llama-style decoder in the same run, with Inductor's FX graph cache and AOTAutograd's cache
turned off (so every compile is a real one) and its kernel cache warm (a warm-up compile of
each backend first, so C++ compilation does not land on whichever goes first), alternating
which goes first. Prints, for each, the fastest wall time and the fastest CPU time of this
process over the repeats, and their ratios. The machine this runs on is shared, so the
verdict uses CPU time (time the process spent compiling, not time it waited for a core).
Target: at most 1.10.

    python bench/compile_overhead.py            # 4 layers, 3 repeats
    python bench/compile_overhead.py --quick    # 1 layer, 1 repeat, a smoke test
"""

from __future__ import annotations

import statistics
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from _common import parser

from fxpass.models.llama import build_decoder

TARGET = 1.10


def _compile_seconds(model: torch.nn.Module, inputs: tuple, backend: str) -> tuple[float, float]:
    """(wall, CPU) seconds of the first call of a freshly compiled model (the compile)."""
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        w0, c0 = time.perf_counter(), time.process_time()
        compiled(*inputs)
        return time.perf_counter() - w0, time.process_time() - c0


def main(argv=None) -> int:
    args = parser(__doc__.splitlines()[0]).parse_args(argv)
    layers = 1 if args.quick else 4
    repeat = 1 if args.quick else args.repeat
    warnings.filterwarnings("ignore")
    torch._inductor.config.fx_graph_cache = False
    torch._functorch.config.enable_autograd_cache = False

    import fxpass as fp

    model = build_decoder(layers=layers, dtype=torch.float32)
    inputs = model.example_inputs()
    default = fp.registry.pass_list("default")
    backends = ("inductor", "fxpass")
    for name in backends:  # warm-up: kernels compiled once, imports done
        _compile_seconds(model, inputs, name)
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in backends}
    for i in range(repeat):
        order = backends if i % 2 == 0 else backends[::-1]
        for name in order:
            times[name].append(_compile_seconds(model, inputs, name))
    torch._dynamo.reset()

    wall = {name: min(t[0] for t in ts) for name, ts in times.items()}
    cpu = {name: min(t[1] for t in ts) for name, ts in times.items()}
    median = {name: statistics.median(t[0] for t in ts) for name, ts in times.items()}
    ratio = cpu["fxpass"] / cpu["inductor"]
    passes = ",".join(default.names()) or "(empty)"
    print(f"model: Llama-style decoder, {layers} layer(s), float32; {repeat} repeat(s)")
    print(f"default pipeline: {passes}")
    print("                                     wall min   wall median     CPU min")
    for name in backends:
        label = f'torch.compile(backend="{name}"):'
        print(
            f"{label:<36} {wall[name] * 1e3:8.0f} ms {median[name] * 1e3:10.0f} ms "
            f"{cpu[name] * 1e3:8.0f} ms"
        )
    print(f"ratio fxpass / inductor, wall min:   {wall['fxpass'] / wall['inductor']:8.3f}")
    print(f"ratio fxpass / inductor, CPU min:    {ratio:8.3f}   (target <= {TARGET})")
    print("PASS" if ratio <= TARGET else "MISS")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
