"""Communication per layer, per strategy, against the minimum; launches before and after
bucketing (part of bench/shard.py).

For each strategy on the embedded decoder and tiny Hugging Face families (2 ranks) it
shards the program and prints, from rank 0's program (:mod:`fxpass.distributed.accounting`):
collectives and bytes per layer (the whole tensors reduced or gathered), the strategy's
minimum per layer, their ratio, the extra collectives and why, and the launches per forward
without and with ``bucket=True``. The ranks are checked consistent
(:mod:`fxpass.distributed.consistency`) before anything is printed; that the bytes counted
here are what the ranks send on gloo is checked by the first table of bench/shard.py
(decoder) and by the tests (every family).
"""

from __future__ import annotations

from typing import Any

import fxpass as fp
from fxpass.distributed.accounting import OUTSIDE
from fxpass.distributed.consistency import trace

#: (label, family, options)
CASES = [
    ("decoder", "decoder", {}),
    ("decoder", "decoder", {"sequence_parallel": True}),
    ("decoder", "decoder", {"sequence_parallel": True, "async_tp": 2}),
    ("decoder, 4 experts + shared", "decoder_moe", {}),
    ("Mixtral", "mixtral", {}),
    ("Olmo3", "olmo3", {}),
    ("Llama", "llama", {"sequence_parallel": True}),
]
QUICK = [CASES[0], CASES[3]]


def _strategy(shards: Any, options: dict) -> str:
    mesh = shards.mesh
    parts = []
    if mesh.ep > 1:
        parts.append(f"EP {mesh.ep}")
    if mesh.tp > 1:
        parts.append(f"TP {mesh.tp}")
    if options.get("sequence_parallel"):
        parts.append("SP")
    if options.get("async_tp"):
        parts.append(f"async TP x{options['async_tp']}")
    return " + ".join(parts)


def _row(label: str, family: str, options: dict) -> dict[str, Any]:
    import _shard_families

    program, *_ = _shard_families._program(family, 2)
    shards = fp.shard(program, 2, **options)
    faults = shards.check()
    assert not faults, "\n".join(map(str, faults))
    comm = shards.communication()
    layers = [r for r in comm.ranks[0] if r.layer != OUTSIDE]
    first = layers[0]
    bucketed = fp.shard(program, 2, bucket=True, **options)
    assert not bucketed.check()
    return {
        "model": label,
        "strategy": _strategy(shards, options),
        "per_layer": ", ".join(f"{n} {k}" for k, n in first.counts.items()),
        "bytes": first.bytes,
        "minimum": f"{first.minimum_count} / {first.minimum_bytes:,}",
        "ratio": first.bytes / first.minimum_bytes if first.minimum_bytes else float("nan"),
        "same": all(_same(r, first) for r in layers),
        "extra": "; ".join(dict.fromkeys(first.extra)) or "-",
        "before": len(trace(shards[0])[0]),
        "after": len(trace(bucketed[0])[0]),
    }


def _same(a: Any, b: Any) -> bool:
    return (a.counts, a.bytes, a.extra) == (b.counts, b.bytes, b.extra)


def show(quick: bool) -> None:
    rows = [_row(*case) for case in (QUICK if quick else CASES)]
    print()
    print("communication per layer (rank 0 of 2; every layer alike unless marked *), against "
          "the strategy's minimum; launches per forward without / with bucketing")  # fmt: skip
    print(f"{'model':<28} {'strategy':<24} {'collectives/layer':<32} {'bytes':>7} "
          f"{'minimum':>13} {'ratio':>6}  {'launches':>9}  extra, and why")  # fmt: skip
    for r in rows:
        star = "" if r["same"] else "*"
        print(f"{r['model']:<28} {r['strategy']:<24} {r['per_layer'] + star:<32} "
              f"{r['bytes']:>7,} {r['minimum']:>13} {r['ratio']:>6.2f}  "
              f"{r['before']:>4} / {r['after']:<3}  {r['extra']}")  # fmt: skip
    print("bytes: the whole tensors reduced or gathered per layer (fp32, 8 tokens, hidden 64); "
          "minimum: TP two all-reduces of the hidden state, SP a reduce-scatter + all-gather "
          "per block, EP the experts' all-reduce combine")  # fmt: skip
