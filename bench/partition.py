"""Capability partitioning time: fxpass against torch's CapabilityBasedPartitioner.

On exported Llama-style graphs of about 2k, 8k and 16k nodes (16, 64, 128 layers), with
support = elementwise and norm ops, time ``fxpass.partition.capability_partitions`` and
torch's ``CapabilityBasedPartitioner(...).propose_partitions()`` (at 2k and 8k nodes; torch
takes minutes at 8k and grows about as N^3), check that both propose the same partitions,
and print the ratios and fxpass's scaling exponent. Targets: at least 50x faster than torch
at 8k nodes, exponent at most 1.2, 16k nodes in under 2 s.

    python bench/partition.py                   # 16/64/128 layers; torch at 16 and 64
    python bench/partition.py --skip-torch-8k   # leave out torch's run at 8k (~3 minutes)
    python bench/partition.py --quick           # 2/4/8 layers, a smoke test
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import exported_decoder, parser, scaling_exponent, timeit
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner

from fxpass.partition import capability_partitions, parse_support

SUPPORT = "elementwise | norm"
TARGET_SPEEDUP = 50.0
TARGET_EXPONENT = 1.2
TARGET_16K_SECONDS = 2.0


def _sets(parts) -> list:
    return sorted(sorted(n.name for n in p.nodes) for p in parts)


def main(argv=None) -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--skip-torch-8k", action="store_true", help="do not run torch at 8k nodes")
    args = p.parse_args(argv)
    layers = [2, 4, 8] if args.quick else [16, 64, 128]
    torch_layers = set(layers[:1] if args.skip_torch_8k else layers[:2])
    support = parse_support(SUPPORT)

    sizes, ours, rows = [], [], []
    for n_layers in layers:
        gm = exported_decoder(n_layers)[0].graph_module
        nodes = len(gm.graph.nodes)
        # fxpass takes milliseconds: more repeats steady the median on a busy machine
        t_ours = timeit(
            lambda gm=gm: capability_partitions(gm, support), repeat=max(args.repeat, 9)
        )
        parts = capability_partitions(gm, support)
        t_torch = None
        if n_layers in torch_layers:
            partitioner = CapabilityBasedPartitioner(gm, support)
            repeat = args.repeat if args.quick else 1  # one torch run at 8k takes minutes
            t_torch = timeit(partitioner.propose_partitions, repeat=repeat)
            same = _sets(partitioner.propose_partitions()) == _sets(parts)
            assert same, f"{n_layers} layers: fxpass and torch propose different partitions"
        sizes.append(nodes)
        ours.append(t_ours)
        rows.append((n_layers, nodes, len(parts), t_ours, t_torch))

    print(f"support: {SUPPORT}")
    print(
        f"{'layers':>6} {'nodes':>7} {'parts':>6} {'fxpass ms':>10} {'torch ms':>11} {'speedup':>9}"
    )
    for n_layers, nodes, count, t_ours, t_torch in rows:
        torch_ms = f"{t_torch * 1e3:11.1f}" if t_torch is not None else f"{'-':>11}"
        speedup = f"{t_torch / t_ours:8.0f}x" if t_torch is not None else f"{'-':>9}"
        print(f"{n_layers:>6} {nodes:>7} {count:>6} {t_ours * 1e3:10.1f} {torch_ms} {speedup}")
    exponent = scaling_exponent(sizes, ours)
    print(f"fxpass scaling exponent: {exponent:.2f} (target <= {TARGET_EXPONENT})")
    failed = exponent > TARGET_EXPONENT and not args.quick
    second = rows[1]
    if second[4] is not None:
        speedup = second[4] / second[3]
        print(f"speedup at {second[1]} nodes: {speedup:.0f}x (target >= {TARGET_SPEEDUP:.0f}x)")
        failed |= speedup < TARGET_SPEEDUP and not args.quick
    largest = rows[-1]
    print(f"{largest[1]} nodes: {largest[3]:.3f} s (target < {TARGET_16K_SECONDS} s at ~16k nodes)")
    failed |= largest[3] >= TARGET_16K_SECONDS
    print("targets met" if not failed else "TARGETS MISSED")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
