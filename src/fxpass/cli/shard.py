"""``fxpass shard``: one program per rank of a tensor-parallel group, from a ``.pt2`` file."""

from __future__ import annotations

from pathlib import Path

import click

from ._common import LOAD, WRITE, CliError, emit_json, import_option, stdout
from ._targets import load_target

__all__ = ["shard_cmd"]


def _output_dir(output: str) -> Path:
    path = Path(output)
    if path.exists() and not path.is_dir():
        raise CliError(f"cannot write the programs to {path}: it is a file, not a folder", WRITE)
    if not path.exists() and not path.parent.is_dir():
        raise CliError(
            f"cannot write the programs to {path}: folder {path.parent} does not exist", WRITE
        )
    return path


@click.command("shard", short_help="Shard a .pt2 program for tensor parallelism, per rank.")
@click.argument("target")
@click.option("--world-size", "-n", type=click.IntRange(min=1), required=True,
              help="Number of ranks.")  # fmt: skip
@click.option("-o", "--output", type=click.Path(file_okay=False), default=None,
              help="Folder for rank<r>.pt2, plan.json and manifest.json.")  # fmt: skip
@click.option("--plan", "plan_file", type=click.Path(dir_okay=False), default=None,
              help="Use this plan (JSON, as written to plan.json) instead of analyzing.")  # fmt: skip
@click.option("--print-plan", is_flag=True, help="Print the plan: each decision and why.")
@click.option("--sequence-parallel", is_flag=True,
              help="Reduce-scatter + all-gather around the norms instead of all-reduce.")  # fmt: skip
@click.option("--fuse", is_flag=True, help="Fuse all-reduce + residual add + RMSNorm.")
@click.option("--uneven", type=click.Choice(["error", "replicate"]), default="error",
              help="What to do with layers the world size does not divide.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print JSON for machines.")
@import_option
def shard_cmd(target, world_size, output, plan_file, print_plan, sequence_parallel, fuse,
              uneven, as_json, imports) -> None:  # fmt: skip
    """Shard TARGET (a .pt2 file) into one program per rank: rank0.pt2 ... in OUTPUT, with
    plan.json (edit it and pass it back with --plan) and manifest.json (world size, plan,
    per-rank files, bytes, sha256). Each rank loads its file and runs it on
    torch.distributed (see docs/distributed.md).
    """
    from ..distributed import ShardPlan, analyze, shard

    if output is None and not print_plan:
        raise click.UsageError("give -o/--output (a folder), or --print-plan to only plan")
    out_dir = _output_dir(output) if output else None
    t = load_target(target, imports=imports)
    if not t.is_exported:
        raise CliError(f"fxpass shard needs an exported program (.pt2), not {t.kind}", LOAD)
    plan = ShardPlan.load(plan_file) if plan_file else None
    if world_size > 1 and plan is None:
        plan = analyze(t.program, world_size, uneven=uneven)
    console = stdout()
    if print_plan and plan is not None:
        if as_json and out_dir is None:
            emit_json(plan.to_dict())
        elif not as_json:
            console.print(plan)
    if out_dir is None:
        return
    shards = shard(t.program, world_size, plan=plan, sequence_parallel=sequence_parallel, fuse=fuse)
    out_dir.mkdir(exist_ok=True)
    shards.plan.save(out_dir / "plan.json")
    try:
        manifest = shards.save(out_dir)
    except OSError as e:
        raise CliError(f"cannot write the programs to {out_dir}: {e.strerror or e}", WRITE) from e
    if as_json:
        import json

        emit_json(json.loads(manifest.read_text()))
        return
    console.print(shards)
    for line in _fuse_notes(shards, fuse):
        console.print(line, style="dim", markup=False, highlight=False)
    console.print(f"wrote {world_size} programs, plan.json and {manifest.name} to {out_dir}")


def _fuse_notes(shards, fuse: bool) -> list[str]:
    """With --fuse: how many sites rank 0 fused, and why none when none (the pass's note)."""
    if not fuse:
        return []
    report = shards.reports[0] if shards.reports else None
    try:
        record = report.find("fuse_allreduce_add_rmsnorm") if report is not None else None
    except KeyError:
        record = None
    if record is None:
        return ["--fuse: nothing to fuse: no all-reduce (one rank, or nothing was sharded)"]
    n = int(record.stats.get("rewrites", 0))
    if n:
        return [f"--fuse: {n} all-reduce + add + RMSNorm site{'s' if n != 1 else ''} fused"]
    return [f"--fuse: {note}" for note in record.notes] or ["--fuse: nothing fused"]
