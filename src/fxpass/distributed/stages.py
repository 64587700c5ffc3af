"""Pipeline stages: a captured program cut into ``N`` programs by a cost model.

``fxpass.distributed.pipeline_stages(program, stages=N)`` walks the graph once and, at every point
between two compute nodes, counts the activations that cross it. Values that depend on no
input (position ids, causal masks, rotary tables) are not sent: the stage that reads them
computes them again. The cuts are chosen among the points a single activation crosses (the
residual stream, between layers) where the graph allows, balancing each stage's share of
the weight bytes and of the FLOPs (the largest stage as small as it can be: an exact search
over the candidate points). Each stage is an :class:`~torch.export.ExportedProgram` of its
nodes — the same node names, its own weights — taking the activations it receives and
returning those it sends (the last one: the program's outputs, flat), so it runs under
``torch.distributed.pipelining`` (``PipelineStage``, ``ScheduleGPipe``, ``Schedule1F1B``):

>>> stages = fxpass.distributed.pipeline_stages(program, stages=2)              # doctest: +SKIP
>>> stage = stages.pipeline_stage(rank, device="cpu")               # doctest: +SKIP
>>> schedule = ScheduleGPipe(stage, n_microbatches=4)               # doctest: +SKIP

Shapes are the capture's: the batch a program was captured with is one microbatch (capture
with batch 1 and feed the schedule ``n_microbatches`` rows), unless the batch dim was
captured dynamic. A program that mutates buffers is refused, and so are more stages than
the program has layers (the most repeated block between the single-crossing points).
"""

from __future__ import annotations

import bisect
import io
import itertools
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from rich.console import Console
from rich.table import Table
from torch import fx
from torch.export import ExportedProgram
from torch.export.exported_program import ModuleCallEntry, ModuleCallSignature
from torch.export.graph_signature import (
    ExportGraphSignature,
    InputKind,
    InputSpec,
    OutputKind,
    OutputSpec,
    TensorArgument,
)
from torch.utils import _pytree as pytree

from ..edit.editor import Editor
from ..fxutil.ops import schema_of
from ..targets.programs import build_program
from .plan import ShardError, Stage, check_stages, plural
from .sites import target_of
from .strategy import Section, Strategy

__all__ = ["STRATEGY", "PipelineStages", "flops", "pipeline_stages"]

aten = torch.ops.aten
_MATMULS = {aten.mm.default, aten.bmm.default, aten.matmul.default, aten.addmm.default,
            aten.linear.default, aten.baddbmm.default}  # fmt: skip


def _val(node: Any) -> Any:
    return node.meta.get("val") if isinstance(node, fx.Node) else None


def _numel(v: Any) -> int:
    if isinstance(v, torch.Tensor):
        return int(v.numel())
    if isinstance(v, (list, tuple)):
        return sum(_numel(x) for x in v)
    return 0


def flops(node: fx.Node) -> int:
    """An estimate of the floating-point operations of one node: ``2·M·N·K`` for matmuls
    (linear, grouped), ``4·B·H·L·S·D`` for attention, one per output element otherwise."""
    out = _val(node)
    op = target_of(node)
    name = getattr(schema_of(op), "name", "")
    if op in _MATMULS or name.endswith("grouped_mm") or name.endswith("grouped_mm_fallback"):
        a = _val(node.args[1] if op is aten.addmm.default else node.args[0])
        if isinstance(a, torch.Tensor) and isinstance(out, torch.Tensor):
            return 2 * int(out.numel()) * int(a.shape[-1])
    if "scaled_dot_product" in name:
        q, k = _val(node.args[0]), _val(node.args[1])
        if isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor):
            return 4 * int(q.numel()) * int(k.shape[-2])
    return _numel(out)


@dataclass
class _Graph:
    """What the cost model reads of a program: its compute nodes in order, which values are
    free (computed from no input), and where each value is last read."""

    ep: ExportedProgram
    compute: list[fx.Node]
    free: set[fx.Node]
    weights: dict[str, InputSpec]  # placeholder name -> spec
    users_pos: dict[fx.Node, int]  # value -> position of its last compute reader (or output)
    pos: dict[fx.Node, int]

    @classmethod
    def of(cls, ep: ExportedProgram) -> _Graph:
        sig = ep.graph_signature
        bad = [s for s in sig.output_specs if s.kind != OutputKind.USER_OUTPUT]
        if bad:
            raise ShardError(
                f"cannot cut a program that mutates buffers into pipeline stages (it writes "
                f"'{bad[0].target}'); capture it without in-place buffer updates"
            )
        weights = {s.arg.name: s for s in sig.input_specs if s.kind != InputKind.USER_INPUT}
        free: set[fx.Node] = set()
        compute: list[fx.Node] = []
        for node in ep.graph.nodes:
            if node.op == "get_attr" or (node.op == "placeholder" and node.name in weights):
                free.add(node)
            elif node.op == "call_function":
                if all(a in free for a in node.all_input_nodes):
                    free.add(node)
                else:
                    compute.append(node)
        pos = {n: i for i, n in enumerate(compute)}
        end = len(compute)
        users_pos: dict[fx.Node, int] = {}
        for node in ep.graph.nodes:
            if node in free:
                continue
            last = -1
            for u in node.users:
                last = max(last, end if u.op == "output" else pos.get(u, -1))
            users_pos[node] = last
        return cls(ep, compute, free, weights, users_pos, pos)

    def crossing(self) -> list[list[fx.Node]]:
        """For each point ``i`` (after compute node ``i``), the values that cross it."""
        starts: list[tuple[int, fx.Node]] = []
        for node, last in self.users_pos.items():
            born = self.pos.get(node, -1)  # user inputs are born before everything
            if last > born:
                starts.append((born, node))
        out: list[list[fx.Node]] = [[] for _ in self.compute]
        for born, node in starts:
            for i in range(max(born, 0), min(self.users_pos[node], len(self.compute))):
                out[i].append(node)
        return out


def _costs(g: _Graph) -> tuple[list[float], list[float]]:
    """Prefix sums of weight bytes (a weight counts where it is first read) and FLOPs."""
    wbytes, fl = [0.0], [0.0]
    seen: set[fx.Node] = set()
    for node in g.compute:
        new = 0
        for a in _weights_of(g, node):
            if a not in seen:
                seen.add(a)
                new += _numel(_val(a)) * _val(a).element_size()
        wbytes.append(wbytes[-1] + new)
        fl.append(fl[-1] + flops(node))
    return wbytes, fl


def _weights_of(g: _Graph, node: fx.Node) -> list[fx.Node]:
    """The weights ``node`` reads, directly or through free nodes."""
    out, todo, seen = [], list(node.all_input_nodes), set()
    while todo:
        a = todo.pop()
        if a in seen or a not in g.free:
            continue
        seen.add(a)
        if a.op == "placeholder":
            out.append(a)
        todo += a.all_input_nodes
    return out


def _layers(g: _Graph, points: list[int]) -> int:
    """How many times the most repeated block between consecutive points occurs (blocks
    that read a weight matrix: not the casts and views between them)."""
    bounds = [-1, *points, len(g.compute) - 1]
    blocks = Counter(
        tuple(str(target_of(n)) for n in g.compute[a + 1 : b + 1])
        for a, b in itertools.pairwise(bounds)
        if any(_val(w).dim() >= 2 for n in g.compute[a + 1 : b + 1] for w in _weights_of(g, n))
    )
    return max(blocks.values(), default=1)


def _choose(g: _Graph, n: int) -> list[int]:
    """The cut points (after compute node ``i``) for ``n`` stages."""
    crossing = g.crossing()
    inner = range(len(g.compute) - 1)
    fewest = min((len(crossing[i]) for i in inner if crossing[i]), default=0)
    points = [i for i in inner if len(crossing[i]) == fewest]
    layers = _layers(g, points)
    if n > layers or len(points) < n - 1:
        raise ShardError(
            f"cannot cut the program into {n} pipeline stages: it has "
            f"{plural(layers, 'layer')} ({plural(len(points), 'place')} where "
            f"{plural(fewest, 'activation')} cross{'es' if fewest == 1 else ''}); use at most "
            f"{layers} stage{'s' if layers != 1 else ''}"
        )
    wbytes, fl = _costs(g)

    def cost(a: int, b: int) -> float:  # compute nodes a+1 .. b
        w = (wbytes[b + 1] - wbytes[a + 1]) / (wbytes[-1] or 1)
        f = (fl[b + 1] - fl[a + 1]) / (fl[-1] or 1)
        return (w + f) / 2

    last = len(g.compute) - 1
    cands = [-1, *points]
    best: dict[tuple[int, int], tuple[float, list[int]]] = {}

    def solve(k: int, start: int) -> tuple[float, list[int]]:
        """Best split of nodes after ``start`` into ``k`` stages."""
        if k == 1:
            return cost(start, last), []
        key = (k, start)
        if key not in best:
            options = []
            for p in cands[bisect.bisect_right(cands, start) :]:
                here = cost(start, p)
                rest, cuts = solve(k - 1, p)
                options.append((max(here, rest), [p, *cuts]))
            best[key] = min(options, default=(float("inf"), []))
        return best[key]

    _, cuts = solve(n, -1)
    if len(cuts) != n - 1:
        raise ShardError(f"cannot cut the program into {n} pipeline stages")
    return cuts


# ----- one stage as an ExportedProgram ----------------------------------------------------------
def _stage_program(
    g: _Graph, nodes: list[fx.Node], receives: list[fx.Node], sends: list[fx.Node], last: bool
) -> ExportedProgram:
    ep = g.ep
    graph = fx.Graph()
    build = Editor(None, "pipeline_stages")  # a new graph: no run watches it yet
    env: dict[fx.Node, fx.Node] = {}
    needed: set[fx.Node] = set()
    todo = [a for n in nodes for a in n.all_input_nodes] + list(sends)
    while todo:  # free values this stage reads are computed here again
        a = todo.pop()
        if a in g.free and a not in needed:
            needed.add(a)
            todo += a.all_input_nodes
    inputs, weights = [], []
    for node in ep.graph.nodes:
        if node.op == "placeholder" and node in needed:
            ph = build.create(graph, "placeholder", node.name)
            ph.meta = dict(node.meta)
            env[node] = ph
            spec = g.weights[node.name]
            weights.append(InputSpec(spec.kind, TensorArgument(ph.name), spec.target,
                                     spec.persistent))  # fmt: skip
    for value in receives:
        ph = build.create(graph, "placeholder", value.name)
        ph.meta = dict(value.meta)
        env[value] = ph
        inputs.append(InputSpec(InputKind.USER_INPUT, TensorArgument(ph.name), None))
    body = set(nodes)
    for node in ep.graph.nodes:
        if node in env or not (node in body or (node in needed and node.op != "placeholder")):
            continue
        env[node] = build.copy(node, lambda a: env[a], into=graph)
    outs = [env[v] for v in sends]
    build.create(graph, "output", "output", (tuple(outs),))
    gm = fx.GraphModule(ep.graph_module, graph)
    signature = ExportGraphSignature(
        [*weights, *inputs],
        [OutputSpec(OutputKind.USER_OUTPUT, TensorArgument(o.name), None) for o in outs],
    )
    targets = {s.target for s in weights}
    state = {k: v for k, v in ep.state_dict.items() if k in targets}
    constants = {k: v for k, v in ep.constants.items() if k in targets}
    example = tuple(_val(v) for v in receives)
    in_spec = pytree.tree_flatten((example, {}))[1]
    out_spec = pytree.tree_flatten(tuple(_val(v) for v in sends))[1]
    call = [ModuleCallEntry("", ModuleCallSignature([], [], in_spec, out_spec))]
    return build_program(gm, signature, like=ep, state_dict=state, constants=constants,
                         range_constraints=dict(ep.range_constraints),
                         module_call_graph=call)  # fmt: skip


@dataclass
class PipelineStages(Sequence):
    """The stage programs (index them by stage) and what the cost model chose."""

    programs: list[ExportedProgram]
    stages: list[Stage]

    def __getitem__(self, i: int) -> ExportedProgram:  # type: ignore[override]
        return self.programs[i]

    def __len__(self) -> int:
        return len(self.programs)

    def pipeline_stage(
        self, stage: int, device: Any = "cpu", group: Any = None, program: Any = None
    ) -> Any:
        """A ``torch.distributed.pipelining.PipelineStage`` running stage ``stage`` (its
        program, or ``program``: the same stage sharded for this rank), on ``group`` (the
        ranks of the pipeline; default: the world)."""
        from torch.distributed.pipelining import PipelineStage

        module = (program if program is not None else self.programs[stage]).module()
        return PipelineStage(module, stage, len(self), torch.device(device), group=group)

    def table(self) -> Table:
        table = Table(title=f"{plural(len(self), 'pipeline stage')}", title_justify="left")
        for col in ("stage", "nodes", "weights (bytes)", "FLOPs", "receives", "sends"):
            table.add_column(
                col, justify="right" if col in ("weights (bytes)", "FLOPs") else "left"
            )
        for i, s in enumerate(self.stages):
            table.add_row(str(i), f"{s.first} .. {s.last}", f"{s.weight_bytes:,}",
                          f"{s.flops:,}", ", ".join(s.receives) or "the inputs",
                          ", ".join(s.sends) or "-")  # fmt: skip
        return table

    def __str__(self) -> str:
        buf = io.StringIO()
        Console(file=buf, width=140, color_system=None, force_terminal=False).print(self.table())
        return buf.getvalue().rstrip()


def _split(g: _Graph, cuts: list[int]) -> tuple[list[ExportedProgram], list[Stage]]:
    crossing = g.crossing()
    bounds = [-1, *cuts, len(g.compute) - 1]
    out_vals = list(g.ep.graph.output_node().all_input_nodes)
    programs, stages = [], []
    user_inputs = [n for n in g.ep.graph.nodes if n.op == "placeholder" and n not in g.free]
    for s, (a, b) in enumerate(itertools.pairwise(bounds)):
        nodes = g.compute[a + 1 : b + 1]
        receives = user_inputs if s == 0 else crossing[a]
        last = s == len(bounds) - 2
        sends = out_vals if last else crossing[b]
        programs.append(_stage_program(g, nodes, receives, sends, last))
        weights = {w for n in nodes for w in _weights_of(g, n)}
        stages.append(
            Stage(
                nodes[0].name,
                nodes[-1].name,
                [v.name for v in receives] if s else [],
                [] if last else [v.name for v in sends],
                sum(_numel(_val(w)) * _val(w).element_size() for w in weights),
                sum(flops(n) for n in nodes),
            )
        )
    return programs, stages


def pipeline_stages(
    program: ExportedProgram, stages: int, *, plan: Sequence[Stage] | None = None
) -> PipelineStages:
    """Cut ``program`` into ``stages`` programs (see the module docstring); ``plan``: the
    stages of a sharding plan to cut at instead of choosing (each names its last node)."""
    if isinstance(stages, bool) or not isinstance(stages, int) or stages < 1:
        raise ShardError(f"stages must be a positive integer, not {stages!r}")
    if not isinstance(program, ExportedProgram):
        raise ShardError(
            "pipeline stages are cut from a torch.export.ExportedProgram, not "
            f"{type(program).__name__}"
        )
    g = _Graph.of(program)
    if plan:
        if len(plan) != stages:
            raise ShardError(f"the plan has {plural(len(plan), 'stage')}, not {stages}")
        pos = {n.name: i for i, n in enumerate(g.compute)}
        missing = [s.last for s in plan[:-1] if s.last not in pos]
        if missing:
            raise ShardError(f"the plan cuts after '{missing[0]}', which the program lacks")
        cuts = [pos[s.last] for s in plan[:-1]]
        if cuts != sorted(set(cuts)):
            raise ShardError("the plan's stages are not in the program's order")
    elif stages == 1:
        cuts = []
    else:
        cuts = _choose(g, stages)
    programs, found = _split(g, cuts)
    return PipelineStages(programs, found)


# ----- the strategy ----------------------------------------------------------------------------
class PipelineStagesStrategy(Strategy):
    """Pipeline parallelism: the program cut into one program per stage, before the other
    strategies follow the plan on each stage's program."""

    name = "pipeline_stages"
    order = 0
    section = Section("stages", Stage, check=check_stages)

    def split(self, program: Any, plan: Any) -> PipelineStages | None:
        """The program cut into the plan's stages (chosen here when the plan lists none,
        and then written into it); None with one stage."""
        if plan.mesh.pp == 1:
            return None
        if not isinstance(program, ExportedProgram):
            raise ShardError("pipeline stages are cut from an ExportedProgram, not a GraphModule")
        stages = pipeline_stages(program, plan.mesh.pp, plan=plan.stages or None)
        plan.stages = stages.stages
        return stages


STRATEGY = PipelineStagesStrategy()
