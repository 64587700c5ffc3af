"""``fxpass check-ranks``: do saved rank programs issue the same collectives, in order?"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from ._common import FAILED, USAGE, CliError, emit_json, import_option, plural, stdout
from ._targets import load_target

__all__ = ["check_ranks_cmd", "print_faults"]


def _mesh(mesh: str | None, files: tuple[str, ...]):
    """The mesh given, else the one in the manifest.json beside the files, else None."""
    from ..distributed import Mesh
    from ..distributed.mesh import MeshError

    if mesh is not None:
        try:
            found = Mesh.parse(mesh)
        except MeshError as e:
            raise CliError(f"--mesh: {e}", USAGE) from None
    else:
        manifest = Path(files[0]).parent / "manifest.json"
        if not manifest.is_file():
            return None
        try:
            found = Mesh.from_dict(json.loads(manifest.read_text())["mesh"])
        except (OSError, ValueError, KeyError, MeshError):
            return None
    if found.world_size != len(files):
        raise CliError(
            f"the mesh {found} has {plural(found.world_size, 'rank')}, but "
            f"{plural(len(files), 'program')} were given (one per rank, in rank order)",
            USAGE,
        )
    return found


def print_faults(faults: list, world_size: int, calls: int) -> None:
    """One line per fault, or the one line that says the ranks agree."""
    console = stdout()
    for fault in faults:
        console.print(str(fault), markup=False, highlight=False, soft_wrap=True)
    if not faults:
        console.print(
            f"consistent: the {world_size} ranks issue the same {plural(calls, 'collective')} "
            "in the same order", markup=False, highlight=False,
        )  # fmt: skip


@click.command("check-ranks", short_help="Check that rank programs issue the same collectives.")
@click.argument("programs", nargs=-1, required=True)
@click.option("--mesh", default=None,
              help="The mesh, e.g. tp=2,pp=2 (default: manifest.json beside the files, else "
              "one group of every rank).")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print JSON for machines.")
@import_option
def check_ranks_cmd(programs, mesh, as_json, imports) -> None:
    """Check PROGRAMS (rank0.pt2 rank1.pt2 ..., in rank order) for collectives that would
    hang: every rank of each process group must issue the same collectives in the same
    order — kind, group, shape, dtype, reduce op — and none on a path only some ranks take.
    Exits 0 when consistent, 1 with one line per fault naming the node on each rank.
    """
    from ..distributed.consistency import check_ranks, trace

    if len(programs) < 2:
        raise click.UsageError("give at least two rank programs (rank0.pt2 rank1.pt2 ...)")
    the_mesh = _mesh(mesh, programs)
    loaded = []
    for path in programs:
        t = load_target(path, imports=imports)
        if not t.is_exported:
            raise CliError(f"{path}: check-ranks reads exported programs (.pt2)", USAGE)
        loaded.append(t.program)
    faults = check_ranks(loaded, the_mesh)
    calls = len(trace(loaded[0])[0])
    if as_json:
        emit_json({"ok": not faults, "world_size": len(loaded),
                   "mesh": the_mesh.to_dict() if the_mesh else None,
                   "faults": [{"group": f.group, "ranks": list(f.ranks), "message": str(f)}
                              for f in faults]})  # fmt: skip
    else:
        print_faults(faults, len(loaded), calls)
    if faults:
        sys.exit(FAILED)
