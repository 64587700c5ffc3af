"""Communication accounting: what each rank's collectives move per layer, against the minimum.

Each collective of a rank's program is put in the layer it serves (the module path its
node inherited from the node it reduces or gathers: ``layers.3``, ``model.layers.3``;
anything else — the embedding, the head — is *outside the layers*), and counted with the
bytes of the whole tensor it reduces or gathers (an all-gather: its output; the others:
their input), the unit the bench and DTensor's counters use.

The minimum per layer is what the strategy cannot do without, two blocks (attention, and
the MLP or the experts) each closing with one exchange of the residual stream:

* tensor parallelism: Megatron's two all-reduces of the hidden state;
* sequence parallelism: a reduce-scatter and an all-gather of the same bytes, twice;
* expert parallelism: the experts' combine — an all-reduce of the hidden state when every
  rank holds every token, which moves less than the all-to-all dispatch and combine of
  the ``top_k`` routed rows of each token (``top_k`` times the hidden state), so the
  minimum is the all-reduce.

Every collective beyond that is listed with why it is there: the vocab-parallel
embedding's all-reduce, the head's all-gather of the logits, a distributed norm's
all-reduce of one float per token, the partial sums of a shared expert reduced apart from
the experts'. A layer at the minimum lists none.

>>> comm = communication(shards)            # doctest: +SKIP
>>> print(comm)                              # rank 0's table (every rank's when they differ)  # doctest: +SKIP
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass, field
from typing import Any

import torch
from rich.console import Console, ConsoleOptions, RenderResult
from rich.table import Table
from torch import fx

from .consistency import Call, trace

__all__ = ["CommReport", "LayerComm", "communication", "rank_communication"]

OUTSIDE = "(outside the layers)"
_LAYER = re.compile(r"^(.*?\.\d+)(?:\.|$)")
_MAIN = {"partial sums", "experts' partial sums", "sequence parallel"}


@dataclass
class LayerComm:
    """One layer's collectives on one rank: counts by kind, bytes, the minimum, the extras."""

    layer: str
    counts: dict[str, int] = field(default_factory=dict)
    bytes: int = 0
    minimum_count: int = 0
    minimum_bytes: int = 0
    extra: list[str] = field(default_factory=list)  # each extra collective and why

    @property
    def at_minimum(self) -> bool:
        return not self.extra and self.bytes <= self.minimum_bytes

    def to_dict(self) -> dict[str, Any]:
        return {"layer": self.layer, "counts": dict(self.counts), "bytes": self.bytes,
                "minimum_count": self.minimum_count, "minimum_bytes": self.minimum_bytes,
                "extra": list(self.extra)}  # fmt: skip


@dataclass
class CommReport:
    """Per rank, the collectives and bytes of each layer against the strategy's minimum."""

    strategy: str
    hidden_bytes: int  # one exchange of the residual stream
    ranks: list[list[LayerComm]]
    notes: list[str] = field(default_factory=list)

    def totals(self, rank: int = 0) -> dict[str, int]:
        rows = self.ranks[rank]
        return {
            "collectives": sum(sum(r.counts.values()) for r in rows),
            "bytes": sum(r.bytes for r in rows),
            "minimum_collectives": sum(r.minimum_count for r in rows),
            "minimum_bytes": sum(r.minimum_bytes for r in rows),
        }

    def to_dict(self) -> dict[str, Any]:
        return {"strategy": self.strategy, "hidden_bytes": self.hidden_bytes,
                "ranks": [[r.to_dict() for r in rows] for rows in self.ranks],
                "notes": list(self.notes)}  # fmt: skip

    def groups(self) -> list[list[int]]:
        """The ranks whose layers' collectives and bytes are the same, grouped."""
        groups: dict[str, list[int]] = {}
        for rank, rows in enumerate(self.ranks):
            groups.setdefault(repr(_key(rows)), []).append(rank)
        return list(groups.values())

    def table(self, rank: int = 0) -> Table:
        ranks = next(g for g in self.groups() if rank in g)
        who = "every rank" if len(ranks) == len(self.ranks) > 1 else (
            f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"
        )  # fmt: skip
        table = Table(title=f"communication per forward, {who}: {self.strategy}",
                      title_justify="left")  # fmt: skip
        for col in ("layer", "collectives", "bytes", "minimum", "extra, and why"):
            table.add_column(col, justify="right" if col in ("bytes",) else "left",
                             overflow="fold")  # fmt: skip
        for r in self.ranks[rank]:
            what = ", ".join(f"{n} {k}" for k, n in r.counts.items()) or "none"
            minimum = f"{r.minimum_count} / {r.minimum_bytes:,} B" if r.minimum_count else "0"
            table.add_row(r.layer, what, f"{r.bytes:,}", minimum, "; ".join(r.extra) or "—")
        t = self.totals(rank)
        table.caption = (
            f"total {t['collectives']} collectives, {t['bytes']:,} bytes; minimum "
            f"{t['minimum_collectives']}, {t['minimum_bytes']:,} bytes (bytes: the whole "
            "tensors reduced or gathered)"
        )
        for note in self.notes:
            table.caption += f"\n{note}"
        table.caption_justify = "left"
        return table

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        for ranks in self.groups():
            yield self.table(ranks[0])

    def __str__(self) -> str:
        buf = io.StringIO()
        Console(file=buf, width=110, color_system=None, force_terminal=False).print(self)
        return buf.getvalue().rstrip()


def _key(rows: list[LayerComm]) -> list:
    return [(r.layer, r.counts, r.bytes) for r in rows]


# ----- one rank ----------------------------------------------------------------------------------
def _module_path(node: fx.Node) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    path = list(stack.values())[-1]
    return str(path[0] if isinstance(path, tuple) else path)


def _layer(path: str) -> str:
    m = _LAYER.match(path)
    return m.group(1) if m else OUTSIDE


def _comm_bytes(call: Call) -> int:
    """The bytes of the whole tensor a collective reduces or gathers."""
    return call.nbytes * (call.size or 1) if call.kind == "all_gather" else call.nbytes


def _role(node: fx.Node, call: Call, path: str, plan: Any, hidden: int) -> str:
    """Why the collective is there, in a few words (a key of :data:`_WHY`, or a main one)."""
    prov = node.meta.get("fxpass_provenance") or {}
    rule = prov.get("rule", "")
    origin = (prov.get("replaced") or [""])[0]
    if rule == "bucket_collectives":
        return "bucket"
    if rule == "async_tp":
        return "chunk"
    if rule == "sequence_parallel" or call.kind == "reduce_scatter":
        return "sequence parallel" if _layer(path) != OUTSIDE else "tokens"
    if call.kind == "all_gather":
        return "gathered output"
    if call.kind == "all_reduce" and _comm_bytes(call) < hidden:
        return "reduction"  # a distributed norm's sum of squares: one value per token
    if plan is not None:
        styles = {d.node: d.style for d in plan.decisions}
        if styles.get(origin) == "vocab":
            return "vocab-parallel embedding"
        if styles.get(origin) == "row":
            return "partial sums"
        if plan.experts:
            return "experts' partial sums"
    if "embed" in path:
        return "vocab-parallel embedding"
    return "partial sums"


_WHY = {
    "vocab-parallel embedding": "the vocab-parallel embedding (each rank looks up its share "
    "of the vocabulary)",
    "gathered output": "the logits of the column-parallel head, gathered whole",
    "reduction": "a distributed norm (one value per token)",
    "bucket": "a bucket of merged small collectives",
    "tokens": "sequence parallel: the embedding reduce-scattered, the tokens gathered for the head",
}


def _residual_bytes(program: Any, gm: fx.GraphModule, calls: list) -> int:
    """One exchange of the residual stream: the embedding's output, or the first float
    activation a pipeline stage receives, else the most common all-reduce."""
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is torch.ops.aten.embedding.default:
            val = node.meta.get("val")
            if isinstance(val, torch.Tensor):
                return val.numel() * val.element_size()
    inputs = None
    if isinstance(program, torch.export.ExportedProgram):
        inputs = set(program.graph_signature.user_inputs)
    for node in gm.graph.nodes:
        val = node.meta.get("val") if node.op == "placeholder" else None
        user = inputs is None or node.name in inputs
        if user and isinstance(val, torch.Tensor) and val.is_floating_point() and val.dim() >= 2:
            return val.numel() * val.element_size()
    sizes = [_comm_bytes(c) for _, c, _ in calls if c.kind == "all_reduce"]
    return max(set(sizes), key=sizes.count) if sizes else 0


def rank_communication(
    program: Any, plan: Any = None, *, sequence_parallel: bool = False
) -> list[LayerComm]:
    """The collectives of one rank's ``program`` per layer, against the minimum (see the
    module docstring); ``plan`` (the :class:`~.plan.ShardPlan`) names what each serves."""
    gm = program.graph_module if isinstance(program, torch.export.ExportedProgram) else program
    nodes = {n.name: n for n in gm.graph.nodes}
    calls = []
    for call in trace(gm)[0]:
        node = nodes.get(call.node)
        path = _module_path(node) if node is not None else ""
        calls.append((node, call, path))
    hidden = _residual_bytes(program, gm, calls)
    rows: dict[str, LayerComm] = {}
    for node, call, path in calls:
        layer = _layer(path)
        row = rows.setdefault(layer, LayerComm(layer))
        kind = call.kind
        row.counts[kind] = row.counts.get(kind, 0) + 1
        row.bytes += _comm_bytes(call)
        role = _role(node, call, path, plan, hidden) if node is not None else "partial sums"
        row.extra.append(role)  # sorted out below
    layers = [r for r in rows.values() if r.layer != OUTSIDE]
    for row in rows.values():
        roles, row.extra = row.extra, []
        if row.layer == OUTSIDE:
            row.extra = [_WHY.get(r, r) for r in roles]
            continue
        per_block = 2 if sequence_parallel else 1
        row.minimum_count = 2 * per_block
        row.minimum_bytes = 2 * per_block * hidden
        main = [r for r in roles if r in _MAIN]
        for r in roles:
            if r not in _MAIN and r != "chunk":
                row.extra.append(_WHY.get(r, r))
        chunks = roles.count("chunk")
        if chunks:  # async TP: each block's collective in chunks, the same bytes
            blocks = row.minimum_count - len(main)
            if chunks > blocks:
                row.extra.append(f"{chunks - blocks} more launches: async TP's chunks (the same "
                                 "bytes, overlapped with the matmuls)")  # fmt: skip
            main += ["chunk"] * min(chunks, blocks)
        if len(main) > row.minimum_count:
            n = len(main) - row.minimum_count
            row.extra.append(
                f"{n} more all-reduce{'s' if n > 1 else ''} of partial sums than two blocks need "
                "(partial sums reduced apart, then added: one all-reduce of their sum would do)"
            )
    order = [*sorted(layers, key=lambda r: _natural(r.layer))]
    if OUTSIDE in rows:
        order.append(rows[OUTSIDE])
    return order


def _natural(text: str) -> list:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", text)]


def _strategy(plan: Any) -> str:
    mesh = plan.mesh
    parts = []
    if plan.options.get("sequence_parallel"):
        parts.append("sequence parallel (minimum: a reduce-scatter and an all-gather of the "
                     "hidden state per block, two blocks per layer)")  # fmt: skip
    else:
        parts.append("tensor parallel (minimum: two all-reduces of the hidden state per layer)")
    if plan.experts and mesh.ep > 1:
        parts.append(
            "expert parallel (the experts' combine: an all-reduce of the hidden state, less "
            "than an all-to-all dispatch and combine of the top-k routed rows)"
        )
    if mesh.pp > 1:
        parts.append(f"{mesh.pp} pipeline stages (activations sent between stages not counted)")
    return "; ".join(parts)


def communication(shards: Any) -> CommReport:
    """The :class:`CommReport` of a :class:`~.sharded.ShardedPrograms`: every rank's
    collectives and bytes per layer against the minimum of its strategy."""
    plan = shards.plan
    sp = bool(plan.options.get("sequence_parallel"))
    ranks = [rank_communication(p, plan, sequence_parallel=sp) for p in shards.programs]
    hidden = 0
    for rows in ranks:
        for r in rows:
            if r.minimum_count:
                hidden = r.minimum_bytes // r.minimum_count
                break
        if hidden:
            break
    notes = []
    above = sorted({r.layer for rows in ranks for r in rows if r.layer != OUTSIDE
                    and not r.at_minimum}, key=_natural)  # fmt: skip
    if not above:
        notes.append("every layer of every rank is at the minimum")
    else:
        notes.append(f"{len(above)} layer{'s' if len(above) != 1 else ''} above the minimum: "
                     "the extra collectives are listed with why")  # fmt: skip
    return CommReport(_strategy(plan), hidden, ranks, notes)
