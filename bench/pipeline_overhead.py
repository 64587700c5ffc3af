"""Pipeline overhead: 20 passes that change nothing, as a ratio to one gm.recompile().

On an exported Llama-style graph of about 16k nodes (128 layers), run 20 no-op passes through
``fxpass.Pipeline`` — rollback snapshot taken, change detection on every pass, checks off —
and divide by the time of one ``gm.recompile()`` of the same graph, measured in the same run.
Target: at most 0.6.

    python bench/pipeline_overhead.py            # 128 layers
    python bench/pipeline_overhead.py --quick    # 8 layers, a smoke test
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import exported_decoder, parser, timeit

import fxpass as fp

TARGET = 0.6


def _noop_returning_none(gm):
    """Looks at every node, changes nothing, does not say so (the pipeline detects it)."""
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is None:  # never true
            return True
    return None


def _noop_returning_false(gm):
    for _ in gm.graph.nodes:
        pass
    return False


def main(argv=None) -> int:
    args = parser(__doc__.splitlines()[0]).parse_args(argv)
    layers = 8 if args.quick else 128
    ep, _, _ = exported_decoder(layers)
    gm = ep.graph_module
    nodes = len(gm.graph.nodes)
    passes = [_noop_returning_none if i % 2 else _noop_returning_false for i in range(20)]
    pipe = fp.Pipeline(passes, run_checks_after_each_pass=False)

    t_recompile = timeit(gm.recompile, repeat=args.repeat)
    t_pipeline = timeit(lambda: pipe.run(gm), repeat=args.repeat)
    result = pipe.run(gm)
    assert not result.modified, "no-op passes must report unmodified"
    t_loop = timeit(lambda: [p(gm) for p in passes], repeat=args.repeat)

    ratio = t_pipeline / t_recompile
    overhead = (t_pipeline - t_loop) / t_recompile
    print(f"graph: {layers} layers, {nodes} nodes")
    print(f"gm.recompile():                      {t_recompile * 1e3:8.1f} ms")
    print(f"20 no-op passes, plain loop:         {t_loop * 1e3:8.1f} ms")
    print(f"20 no-op passes through Pipeline:    {t_pipeline * 1e3:8.1f} ms")
    print(f"ratio pipeline / recompile:          {ratio:8.3f}   (target <= {TARGET})")
    print(f"pipeline overhead / recompile:       {overhead:8.3f}")
    print("PASS" if ratio <= TARGET else "MISS")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
