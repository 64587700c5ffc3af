"""``fxpass shard``: one program per rank of a ``tp x ep x pp`` mesh, from a ``.pt2`` file."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ._common import (
    FAILED,
    LOAD,
    USAGE,
    WRITE,
    CliError,
    check_writable,
    emit_json,
    import_option,
    stdout,
)
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


def _plan(plan_file: str | None):
    """The plan file, read and checked field by field (a bad one is a usage error)."""
    from ..distributed import PlanError, ShardPlan

    if plan_file is None:
        return None
    try:
        return ShardPlan.load(plan_file)
    except PlanError as e:
        raise CliError(f"{plan_file}: {e}", USAGE) from None


_DIM = click.IntRange(min=1)


@click.command("shard", short_help="Shard a .pt2 program per rank: tensor, expert, pipeline.")
@click.argument("target")
@click.option("--world-size", "-n", type=_DIM, default=None,
              help="Number of ranks (the mesh is chosen: TP, and EP for experts).")  # fmt: skip
@click.option("--tp", type=_DIM, default=None, help="Tensor-parallel ranks per expert group.")
@click.option("--ep", type=_DIM, default=None, help="Expert groups (experts split across them).")
@click.option("--pp", type=_DIM, default=None, help="Pipeline stages (cut by a cost model).")
@click.option("-o", "--output", type=click.Path(file_okay=False), default=None,
              help="Folder for rank<r>.pt2, plan.json and manifest.json.")  # fmt: skip
@click.option("--plan", "plan_file", type=click.Path(dir_okay=False), default=None,
              help="Use this plan (JSON, as written to plan.json) instead of analyzing.")  # fmt: skip
@click.option("--print-plan", is_flag=True, help="Print the plan: each decision and why.")
@click.option("--sequence-parallel", is_flag=True, default=None,
              help="Reduce-scatter + all-gather around the norms instead of all-reduce.")  # fmt: skip
@click.option(
    "--fuse", is_flag=True, default=None, help="Fuse all-reduce + residual add + RMSNorm."
)
@click.option("--bucket", type=click.IntRange(min=0), default=None, is_flag=False,
              flag_value=64 * 1024, metavar="[BYTES]",  # bucket_collectives.DEFAULT_THRESHOLD
              help="Merge adjacent collectives of at most BYTES each (default 64 KiB) into "
              "one launch.")  # fmt: skip
@click.option("--async-tp", "async_tp", type=click.IntRange(min=2), default=None,
              is_flag=False, flag_value=2, metavar="[CHUNKS]",
              help="Split all-gather -> matmul and matmul -> reduce-scatter into CHUNKS "
              "(default 2) that overlap communication and compute (with "
              "--sequence-parallel).")  # fmt: skip
@click.option("--gate", "gates", multiple=True, metavar="OPTION=LO..HI",
              help="Apply OPTION (sequence_parallel, fuse, bucket, async_tp) only to token "
              "counts LO..HI (HI may be left out); repeatable.")  # fmt: skip
@click.option("--uneven", type=click.Choice(["error", "replicate"]), default="error",
              help="What to do with layers the ranks do not divide.")  # fmt: skip
@click.option("--report", "html", type=click.Path(dir_okay=False), default=None,
              is_flag=False, flag_value="",
              help="Print each rank's collectives and bytes per layer against the strategy's "
              "minimum; with a FILE, also write each rank's HTML report (what each strategy "
              "inserted, drawn): FILE for one rank, else FILE with .rank<r> before its "
              "suffix.")  # fmt: skip
@click.option("--verify", is_flag=True,
              help="Check that every rank issues the same collectives in the same order "
              "(exit 1, writing nothing, with one line per fault).")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print JSON for machines.")
@import_option
def shard_cmd(target, world_size, tp, ep, pp, output, plan_file, print_plan, sequence_parallel,
              fuse, bucket, async_tp, gates, uneven, html, verify, as_json,
              imports) -> None:  # fmt: skip
    """Shard TARGET (a .pt2 file) into one program per rank: rank0.pt2 ... in OUTPUT, with
    plan.json (edit it and pass it back with --plan) and manifest.json (mesh, plan, per-rank
    files, bytes, sha256). Give the number of ranks (-n) or the mesh (--tp, --ep, --pp; the
    ranks are their product). Each rank loads its file and runs it on torch.distributed; with
    --pp, under torch.distributed.pipelining (see docs/distributed.md).
    """
    from ..distributed import PlanError, ShardError
    from ..distributed.accounting import communication
    from ..distributed.consistency import trace
    from ..distributed.planning import plan_shards
    from ..distributed.sharded import shard_planned

    plan = _plan(plan_file)
    if world_size is None and tp is None and ep is None and pp is None and plan is None:
        raise click.UsageError("give the number of ranks (-n/--world-size) or --tp/--ep/--pp")
    if output is None and not print_plan and not verify:
        raise click.UsageError("give -o/--output (a folder), or --print-plan to only plan")
    out_dir = _output_dir(output) if output else None
    if html:
        check_writable(html, "report")
    reports = _Reports(html, target) if html and out_dir is not None else None
    t = load_target(target, imports=imports)
    if not t.is_exported:
        raise CliError(f"fxpass shard needs an exported program (.pt2), not {t.kind}", LOAD)
    try:  # the one planning step: mesh, analysis, options, stage cut
        planned = plan_shards(t.program, world_size, tp=tp, ep=ep, pp=pp, plan=plan,
                              sequence_parallel=sequence_parallel, fuse=fuse, bucket=bucket,
                              async_tp=async_tp, gates=_gates(gates), uneven=uneven)  # fmt: skip
    except PlanError as e:  # a plan for another mesh
        raise CliError(str(e), USAGE) from None
    except ShardError as e:
        if "gate" not in str(e):
            raise
        raise CliError(f"--gate: {e}", USAGE) from None
    console = stdout()
    if out_dir is None and not verify:
        shown = planned.plan if planned.mesh.world_size > 1 else plan
        if as_json:
            emit_json(shown.to_dict() if shown is not None else {})
        elif shown is not None:
            console.print(shown)
        return
    n = planned.mesh.world_size
    if reports is not None:
        reports.world_size = n
    shards = shard_planned(planned, instrument=reports)
    if print_plan and not as_json:
        console.print(shards.plan)
    if verify:
        faults = shards.check()
        if faults or out_dir is None or not as_json:
            from .check_ranks import print_faults

            print_faults(faults, shards.world_size, len(trace(shards[0])[0]))
        if faults:
            sys.exit(FAILED)
        if out_dir is None:
            return
    out_dir.mkdir(exist_ok=True)
    shards.plan.save(out_dir / "plan.json")
    try:
        manifest = shards.save(out_dir)
    except OSError as e:
        raise CliError(f"cannot write the programs to {out_dir}: {e.strerror or e}", WRITE) from e
    written = reports.written() if reports is not None else []
    comm = communication(shards) if html is not None else None
    if as_json:
        import json

        data = json.loads(manifest.read_text())
        if reports is not None:
            data["reports"] = [str(p) for p in written]
        if comm is not None:
            data["communication"] = comm.to_dict()
        emit_json(data)
        return
    console.print(shards)
    if comm is not None:
        console.print(comm)
    if reports is not None:
        console.print(
            "report: " + (", ".join(str(p) for p in written) or "none (no rank ran a pass)"),
            markup=False, highlight=False,
        )  # fmt: skip
    for entry in shards.plan.applied:
        state = "applied" if entry["applied"] else "not applied"
        console.print(f"{entry['option']}: {state}: {entry['why']}", style="dim",
                      markup=False, highlight=False)  # fmt: skip
    first = shards.reports[0] if shards.reports else None  # rank 0's
    fused = int(first.stats().get("fuse_allreduce_add_rmsnorm.rewrites", 0)) if first else 0
    if fuse and fused:  # when none, the shards' notes above say why
        console.print(f"--fuse: {fused} all-reduce + add + RMSNorm site{'s' if fused != 1 else ''} "
                      "fused", style="dim", markup=False, highlight=False)  # fmt: skip
    console.print(
        f"wrote {n} program{'s' if n != 1 else ''}, plan.json and {manifest.name} to {out_dir}"
    )


def _gates(gates: tuple[str, ...]) -> dict[str, str]:
    """``--gate OPTION=LO..HI`` -> ``{OPTION: "LO..HI"}``."""
    out = {}
    for text in gates:
        name, eq, rng = text.partition("=")
        if not eq or not name.strip() or not rng.strip():
            raise CliError(f"--gate takes OPTION=LO..HI (e.g. async_tp=512..), not {text!r}",
                           USAGE)  # fmt: skip
        out[name.strip()] = rng.strip()
    return out


class _Reports:
    """One :class:`~fxpass.html.HtmlReport` per rank that runs passes (``shard``'s
    ``instrument``): ``path`` for one rank, else ``path`` with ``.rank<r>`` before its
    suffix."""

    def __init__(self, path: str, target: str, world_size: int = 1) -> None:
        self.path, self.target, self.world_size = Path(path), target, world_size
        self.made: list = []

    def __call__(self, rank: int) -> list:
        import sys

        from ..html import HtmlReport

        path = self.path
        if self.world_size > 1:
            path = path.with_name(f"{path.stem}.rank{rank}{path.suffix}")
        info = {"target": self.target, "rank": str(rank),
                "command": "fxpass " + " ".join(sys.argv[1:])}  # fmt: skip
        title = f"fxpass shard: {Path(self.target).name}, rank {rank} of {self.world_size}"
        report = HtmlReport(path, title=title, info=info)
        self.made.append(report)
        return [report]

    def written(self) -> list[Path]:
        return [r.written for r in self.made if r.written is not None]
