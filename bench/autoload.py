"""What fxpass's torch plug-in (``src/fxpass_autoload.py``) adds to ``import torch``.

Every process that imports torch where fxpass is installed runs the plug-in, fxpass used or
not, so it must cost next to nothing. Each measurement is a fresh interpreter (median of
``--repeat``, at least 5, the variants interleaved so a busy machine slows them alike):

* ``plain``: ``import torch`` as it is without fxpass: torch scans the ``torch.backends``
  entry points (it does wherever plug-in autoloading is on, the default) and finds none of
  fxpass's (filtered out of ``importlib.metadata.entry_points`` before torch asks);
* ``autoload``: ``import torch`` as every user of fxpass gets it: torch runs fxpass's plug-in;
* ``first op``: that, then the first ``torch.ops.fxpass.rms_norm`` lookup, which imports
  fxpass (what loading a fused program costs once);
* ``no plug-ins``: ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``, torch without its plug-in scan.

It prints the times and the ratios ``autoload/plain`` (what fxpass adds to every
``import torch``; target: <= 1.02) and ``first op/plain``; and the in-process cost of
``fxpass_autoload.install()`` itself.

    python bench/autoload.py            # 9 runs each
    python bench/autoload.py --quick    # 1 run each, a smoke test
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import parser

# Both variants wrap entry_points the same way; only "plain" drops fxpass's plug-in.
_TIMED = """
import time
t0 = time.perf_counter()
import importlib.metadata as md
real = md.entry_points
keep = lambda e: {keep}
md.entry_points = lambda **kw: md.EntryPoints([e for e in real(**kw) if keep(e)])
import torch
{extra}
print(time.perf_counter() - t0)
"""
_NOT_OURS = "e.value != 'fxpass_autoload:install'"
VARIANTS = {
    "plain": ({}, _NOT_OURS, ""),
    "autoload": ({}, "True", ""),
    "first op": ({}, "True", "torch.ops.fxpass.rms_norm"),
    "no plug-ins": ({"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}, "True", ""),
}


def _once(env: dict[str, str], keep: str, extra: str) -> float:
    full = {**os.environ, **env}
    out = subprocess.run(
        [sys.executable, "-c", _TIMED.format(keep=keep, extra=extra)],
        env=full,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return float(out.strip().splitlines()[-1])


def _install_cost(n: int) -> float:
    """Seconds per ``install()`` on a fresh ``torch.ops`` namespace (in this process)."""
    import torch

    import fxpass_autoload

    total = 0.0
    for _ in range(n):
        vars(torch.ops).pop("fxpass_bench", None)
        t0 = time.perf_counter()
        fxpass_autoload._NAMESPACE = "fxpass_bench"
        fxpass_autoload.install()
        total += time.perf_counter() - t0
    fxpass_autoload._NAMESPACE = "fxpass"
    vars(torch.ops).pop("fxpass_bench", None)
    return total / n


def main() -> None:
    args = parser(__doc__.splitlines()[0]).parse_args()
    runs = 1 if args.quick else max(args.repeat, 9)
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for _ in range(runs):
        for name, (env, keep, extra) in VARIANTS.items():
            times[name].append(_once(env, keep, extra))
    med = {name: statistics.median(ts) for name, ts in times.items()}
    for name, t in med.items():
        print(f"{name:>11}: import torch {t * 1e3:7.1f} ms (median of {runs})")
    print(f"ratio autoload/plain: {med['autoload'] / med['plain']:.3f} (target <= 1.02)")
    print(f"ratio first op/plain: {med['first op'] / med['plain']:.3f} (imports fxpass once)")
    print(f"install() itself: {_install_cost(1000) * 1e6:.1f} us")


if __name__ == "__main__":
    main()
