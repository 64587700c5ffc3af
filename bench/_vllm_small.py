"""Registration + apply of vLLM's passes on the small graphs of vLLM's own tests, in CPU
seconds: each case of ``tests/compat/vllm/vllm_side.py`` (the IR lowering first, as the first
graph of a process), in this one fresh process, stock Inductor or fxpass.

    .venv-vllm/bin/python bench/_vllm_small.py {stock,fxpass}    # one JSON line per case

Run it several times per mode (each a fresh process: the first graph of a process pays for
what later graphs reuse) and compare medians; docs/inductor.md's small-graph table is made
this way. ``vllm_side.py`` times with ``time.perf_counter``; here it reads
``time.process_time`` instead (other work on a shared machine slows the wall clock, much
less the CPU time).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

MODE = sys.argv[1] if __name__ == "__main__" else "stock"
if MODE == "fxpass":
    import fxpass.compat.inductor as fxi

    fxi.install()

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "compat" / "vllm"))
time.perf_counter = time.process_time  # vllm_side's clock: CPU time instead
import vllm_side  # noqa: E402


def main() -> int:
    from vllm.platforms import current_platform

    current_platform.import_kernels()
    import cpu_ops  # noqa: F401  (the fused kernels the fusions rewrite to)

    cases = [c for c in vllm_side.CASES if c not in ("ir_lowering", "dump_patterns")]
    for case in ["ir_lowering", *cases]:
        result = vllm_side.CASES[case]()
        runs = result.items() if "register_s" not in result else [("", result)]
        for sub, run in runs:
            row = {
                "case": case,
                "sub": sub,
                "mode": MODE,
                "register": run["register_s"],
                "apply": run["apply_s"],
                "total": run["register_s"] + run["apply_s"],
            }
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
