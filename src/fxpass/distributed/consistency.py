"""Rank consistency: every rank issues the same collectives, in the same order, before any runs.

A collective is a rendezvous: when one rank issues an all-reduce of ``[8, 64]`` floats and
another an all-gather, or skips it, or reduces ``[8, 32]``, a real cluster does not raise —
it hangs, or reads garbage. PyTorch's ``spmd_check`` compares the collectives of the ranks'
graphs for this reason; :func:`check_ranks` does the same on the N programs ``fxpass
shard`` writes, from the graphs alone:

* per process group, each rank's collectives (:func:`trace`, in graph order) must match
  those of the group's first rank one for one: the kind, the reduce op, the group size, the
  shape and dtype of what is sent;
* every rank of a group must issue the group's collectives (a rank that issues none while
  the others do is a fault, found from the mesh's groups);
* no collective may sit on a path only some ranks take: inside a ``cond`` branch unless
  both branches issue the same collectives, or inside a ``while_loop`` body (its trip count
  is data).

Each fault is one line naming the node on each rank::

    group '0', collective 3: rank 0 runs 'all_reduce_2' (all_reduce sum f32[1, 8, 64]), rank 1 runs 'all_gather_into_tensor' (all_gather f32[8, 32] x2): the kind differs

>>> faults = check_ranks(shards.programs, shards.mesh)      # doctest: +SKIP
>>> for f in faults: print(f)                                # doctest: +SKIP
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

from .collectives import C10D, DEFAULT_GROUP
from .mesh import Mesh

__all__ = ["Call", "Fault", "check_ranks", "trace"]

_HOP = torch.ops.higher_order


@dataclass(frozen=True)
class Call:
    """One collective a rank issues: the node, what it does, on which group."""

    node: str
    kind: str  # all_reduce, all_gather, reduce_scatter, all_to_all
    group: str
    op: str | None  # the reduce op (all_reduce, reduce_scatter)
    size: int | None  # the group size the op names (all_gather, reduce_scatter)
    shape: tuple[int, ...]
    dtype: str
    where: str = ""  # "" at the top level; else the control flow it sits in

    @property
    def signature(self) -> tuple:
        return (self.kind, self.group, self.op, self.size, self.shape, self.dtype)

    @property
    def nbytes(self) -> int:
        """The bytes of what this rank sends into the collective."""
        n = 1
        for s in self.shape:
            n *= s
        return n * _itemsize(self.dtype)

    def describe(self) -> str:
        dims = ", ".join(map(str, self.shape))
        op = f" {self.op}" if self.op else ""
        size = f" x{self.size}" if self.size else ""
        return f"'{self.node}' ({self.kind}{op} {_short(self.dtype)}[{dims}]{size})"


@dataclass(frozen=True)
class Fault:
    """One inconsistency: a one-line message naming the node on each rank involved."""

    group: str
    ranks: tuple[int, ...]
    message: str

    def __str__(self) -> str:
        return self.message


_SHORT = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64",
          "int64": "i64", "int32": "i32"}  # fmt: skip


def _short(dtype: str) -> str:
    return _SHORT.get(dtype, dtype)


def _itemsize(dtype: str) -> int:
    return getattr(torch, dtype).itemsize if hasattr(torch, dtype) else 0


def _graph_module(program: Any) -> fx.GraphModule:
    if isinstance(program, torch.export.ExportedProgram):
        return program.graph_module
    if isinstance(program, fx.GraphModule):
        return program
    raise TypeError(f"check_ranks takes ExportedPrograms or GraphModules, not {type(program)}")


def _val(arg: Any) -> tuple[tuple[int, ...], str]:
    val = arg.meta.get("val") if isinstance(arg, fx.Node) else None
    if isinstance(val, torch.Tensor):
        return tuple(int(s) for s in val.shape), str(val.dtype).removeprefix("torch.")
    return (), "?"


def _call(node: fx.Node, where: str) -> Call | None:
    """The collective ``node`` issues, or None."""
    if node.op != "call_function":
        return None
    t, a = node.target, node.args
    if t is C10D.all_reduce.default:
        return Call(node.name, "all_reduce", str(a[2]), str(a[1]), None, *_val(a[0]), where)
    if t is C10D.all_gather_into_tensor.default:
        return Call(node.name, "all_gather", str(a[2]), None, int(a[1]), *_val(a[0]), where)
    if t is C10D.reduce_scatter_tensor.default:
        return Call(node.name, "reduce_scatter", str(a[3]), str(a[1]), int(a[2]), *_val(a[0]),
                    where)  # fmt: skip
    if t is C10D.all_to_all_single.default:
        return Call(node.name, "all_to_all", str(a[3]), None, None, *_val(a[0]), where)
    if t is torch.ops.fxpass.all_reduce_add_rmsnorm.default:  # communicates its x
        return Call(node.name, "all_reduce", str(a[5]), "sum", None, *_val(a[0]), where)
    return None


def trace(program: Any) -> tuple[list[Call], list[str]]:
    """The collectives ``program`` issues per run, in order, and the problems of those on
    paths only some ranks may take (one line each)."""
    gm = _graph_module(program)
    calls: list[Call] = []
    problems: list[str] = []
    _walk(gm, gm.graph, "", calls, problems)
    return calls, problems


def _sub(gm: fx.GraphModule, arg: Any) -> fx.GraphModule | None:
    if isinstance(arg, fx.Node) and arg.op == "get_attr":
        sub = getattr(gm, str(arg.target), None)
        return sub if isinstance(sub, fx.GraphModule) else None
    return None


def _walk(gm: fx.GraphModule, graph: fx.Graph, where: str, calls: list, problems: list) -> None:
    for node in graph.nodes:
        call = _call(node, where)
        if call is not None:
            calls.append(call)
            continue
        if node.op != "call_function":
            continue
        if node.target is _HOP.cond:
            branches = [_sub(gm, node.args[1]), _sub(gm, node.args[2])]
            seen = []
            for branch in branches:
                inner: list[Call] = []
                if branch is not None:
                    _walk(branch, branch.graph, f"cond '{node.name}'", inner, problems)
                seen.append(inner)
            sigs = [[c.signature for c in s] for s in seen]
            if sigs[0] != sigs[1]:
                names = [", ".join(c.describe() for c in s) or "none" for s in seen]
                problems.append(
                    f"cond '{node.name}' issues different collectives in its branches (true: "
                    f"{names[0]}; false: {names[1]}): ranks whose predicate differs hang"
                )
            calls.extend(seen[0])
        elif node.target is _HOP.while_loop:
            body = _sub(gm, node.args[1])
            inner = []
            if body is not None:
                _walk(body, body.graph, f"while_loop '{node.name}'", inner, problems)
            for c in inner:
                problems.append(
                    f"{c.describe()} sits in the body of while_loop '{node.name}': its trip "
                    "count is data, and ranks that loop a different number of times hang"
                )
            calls.extend(inner)


def _groups(mesh: Mesh | None, world_size: int, traces: list[list[Call]]) -> dict[str, list[int]]:
    """Every process group the ranks use and its ranks: from the mesh where given (so a
    rank that skips a group's collectives is seen), else from who uses it."""
    groups: dict[str, list[int]] = {}
    if mesh is not None:
        if mesh.world_size != world_size:
            raise ValueError(f"the mesh {mesh} has {mesh.world_size} ranks, not {world_size}")
        groups[DEFAULT_GROUP] = list(range(world_size))
        for name, ranks in mesh.groups():
            groups[name] = list(ranks)
    for rank, calls in enumerate(traces):
        for c in calls:
            if mesh is None and c.group == DEFAULT_GROUP:
                groups.setdefault(c.group, list(range(world_size)))
            else:
                members = groups.setdefault(c.group, [])
                if mesh is None and rank not in members:
                    members.append(rank)
    return groups


def check_ranks(programs: Sequence[Any], mesh: Mesh | dict | None = None) -> list[Fault]:
    """The faults of the ranks' programs (``programs[r]`` runs on rank ``r``): collectives
    that differ between the ranks of a group, and collectives on paths only some ranks may
    take. An empty list: every rank issues the same collectives in the same order.
    ``mesh`` names the process groups and their ranks (default: group ``"0"`` is every
    rank, and another group the ranks that use it)."""
    if isinstance(mesh, dict):
        mesh = Mesh.from_dict(mesh)
    traced = [trace(p) for p in programs]
    traces = [t[0] for t in traced]
    faults: list[Fault] = []
    for rank, (_, problems) in enumerate(traced):
        for p in problems:
            faults.append(Fault("", (rank,), f"rank {rank}: {p}"))
    for group, ranks in _groups(mesh, len(programs), traces).items():
        faults.extend(_compare(group, sorted(ranks), traces))
    return faults


def _compare(group: str, ranks: list[int], traces: list[list[Call]]) -> list[Fault]:
    per = {r: [c for c in traces[r] if c.group == group] for r in ranks}
    if not ranks:
        return []
    ref = ranks[0]
    faults = []
    for rank in ranks[1:]:
        fault = _first_difference(group, ref, per[ref], rank, per[rank])
        if fault is not None:
            faults.append(fault)
    return faults


def _why(a: Call, b: Call) -> str:
    if a.kind != b.kind:
        return "the kind differs"
    if a.op != b.op:
        return "the reduce op differs"
    if a.size != b.size:
        return "the group size differs"
    if a.shape != b.shape:
        return "the shape differs"
    return "the dtype differs"


def _first_difference(
    group: str, ref: int, mine: list[Call], rank: int, theirs: list[Call]
) -> Fault | None:
    """The first place where ``rank``'s collectives on ``group`` leave ``ref``'s."""
    counts = f"rank {ref} issues {len(mine)} on the group, rank {rank} {len(theirs)}"
    if len(mine) == len(theirs):
        for i, (a, b) in enumerate(zip(mine, theirs, strict=True)):
            if a.signature != b.signature:
                same = sorted(c.signature for c in mine) == sorted(c.signature for c in theirs)
                extra = "; the same collectives in another order" if same else ""
                return Fault(
                    group,
                    (ref, rank),
                    f"group '{group}', collective {i + 1}: rank {ref} runs {a.describe()}, "
                    f"rank {rank} runs {b.describe()}: {_why(a, b)}{extra}",
                )
        return None
    # align on what the collectives are, and where the ranks' programs share node names (one
    # plan's ranks do) on the names too: which of two equal all-reduces is missing
    names = {c.node for c in mine} & {c.node for c in theirs}
    by_name = len(names) * 2 >= min(len(mine), len(theirs))

    def key(c: Call) -> tuple:
        return (c.signature, c.node) if by_name else c.signature

    matcher = difflib.SequenceMatcher(None, [key(c) for c in mine], [key(c) for c in theirs],
                                      autojunk=False)  # fmt: skip
    for tag, i1, _, j1, _ in matcher.get_opcodes():
        if tag == "equal":
            continue
        if tag == "replace":
            a, b = mine[i1], theirs[j1]
            if a.signature == b.signature:  # only the names differ
                continue
            return Fault(
                group,
                (ref, rank),
                f"group '{group}', collective {i1 + 1}: rank {ref} runs {a.describe()}, rank "
                f"{rank} runs {b.describe()}: {_why(a, b)} ({counts})",
            )
        # one rank issues collectives the other does not
        longer, other, calls, at, rest = (
            (ref, rank, mine, i1, theirs) if tag == "delete" else (rank, ref, theirs, j1, mine)
        )
        pos = j1 if tag == "delete" else i1
        there = f"after {rest[pos - 1].describe()}" if pos > 0 else "before its first"
        return Fault(
            group,
            (ref, rank),
            f"group '{group}', collective {at + 1}: rank {longer} runs {calls[at].describe()}, "
            f"rank {other} has none there ({there}): the ranks hang "
            f"({counts})",
        )
    return None
