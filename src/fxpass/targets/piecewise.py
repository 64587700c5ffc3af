"""Piecewise graphs: split at chosen ops, run passes on each piece, stitch back together.

SGLang's and vLLM's piecewise backends cut a model's graph at attention so that everything
between two attention calls can be captured as a CUDA graph (attention, with its varying
KV-cache, runs eagerly in between). :func:`split` does the cut: every splitting op becomes a
piece of its own, the runs of ops between them become the other pieces, and a top-level
module calls the pieces in order::

    graph():                                      # PiecewiseGraph.module
        %submod_0 = call_module[target=submod_0](args = (%x, ...))   # projections, rope
        %submod_1 = call_module[target=submod_1](args = (...))       # attention (split op)
        %submod_2 = call_module[target=submod_2](args = (...))       # o_proj, MLP, ...
        ...

:meth:`PiecewiseGraph.run` runs a pipeline on each piece (all or nothing: a failure puts
every piece back), :meth:`PiecewiseGraph.stitch` inlines the pieces back into one flat
GraphModule, and :meth:`PiecewiseGraph.compile` hands each piece to a compiler (the
torch.compile backend uses it with ``split_at=...``).

``at`` names the splitting ops: ``"attention"`` (every SDPA spelling, at the torch level
and in ATen), ``"streams"`` (fxpass's stream and event ops), op overloads or packets,
``"aten.mm.default"``-style strings, or a predicate ``node -> bool``.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx
from torch.fx.passes.split_module import split_module

from ..core.errors import PassFailedError
from ..core.pipeline import resolve_pipeline
from ..core.report import Report
from ..core.snapshot import GraphSnapshot
from ..edit.editor import Editor
from ..fxutil.fx_internals import use_codegen
from ..fxutil.ops import resolve_op
from ..fxutil.paths import get_path
from ..ops.stream import STREAM_OPS
from .runner import Runner, graph_sample_inputs

__all__ = ["ALIASES", "Piece", "PiecewiseGraph", "piecewise", "split", "split_predicate"]

aten = torch.ops.aten


def _attention_ops() -> tuple[Any, ...]:
    names = (
        "scaled_dot_product_attention",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_fused_attention_overrideable",
    )
    ops: list[Any] = [F.scaled_dot_product_attention, torch._C._nn.scaled_dot_product_attention]
    ops += [getattr(aten, n) for n in names if hasattr(aten, n)]
    return tuple(ops)


def _stream_ops() -> tuple[Any, ...]:
    return tuple(STREAM_OPS)


#: Names that stand for a family of ops in ``at=``. ``"streams"``: fxpass's stream and event
#: ops, so that compiling a multi-stream schedule piece by piece keeps them in place.
ALIASES: dict[str, Callable[[], tuple[Any, ...]]] = {
    "attention": _attention_ops,
    "streams": _stream_ops,
}


def _resolve_op(name: str) -> Any:
    if name in ALIASES:
        return ALIASES[name]()
    hint = "use 'attention', an op name like 'aten.mm.default', an op, or a predicate node -> bool"
    if "." not in name:
        raise ValueError(f"cannot split at {name!r}: {hint}")
    try:
        obj = resolve_op(name)
    except ValueError as e:
        raise ValueError(f"cannot split at {name!r}: there is no op torch.ops.{name}") from e
    if not isinstance(obj, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        raise ValueError(f"cannot split at {name!r}: {name} is not an op; {hint}")
    return obj


def split_predicate(at: Any) -> Callable[[fx.Node], bool]:
    """Turn what ``at=`` accepts into a predicate on nodes."""
    if callable(at) and not _is_op(at):
        return at  # already a predicate
    from ..partition.support import op_support

    items = [at] if isinstance(at, str) or _is_op(at) else list(at)
    ops: list[Any] = []
    for item in items:
        resolved = _resolve_op(item) if isinstance(item, str) else item
        ops.extend(resolved if isinstance(resolved, tuple) else (resolved,))
    # what calls no function can be no call_function's target: op_support would refuse it
    support = op_support([op for op in ops if callable(op)])

    def predicate(node: fx.Node) -> bool:
        return node.op == "call_function" and support.is_node_supported({}, node)

    return predicate


def _is_op(obj: Any) -> bool:
    """Torch functions (``F.scaled_dot_product_attention``) are ops here, not predicates."""
    return isinstance(obj, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)) or (
        getattr(obj, "__module__", "") or ""
    ).startswith(("torch.", "torch._C"))


@dataclass
class Piece:
    """One piece: its attribute ``name`` on the top module, its GraphModule, and whether it
    is a splitting op (``is_split``), which passes and compilers leave alone by default."""

    name: str
    module: fx.GraphModule
    is_split: bool

    def __repr__(self) -> str:
        kind = "split op" if self.is_split else f"{len(self.module.graph.nodes)} nodes"
        return f"Piece({self.name}, {kind})"


@dataclass
class PiecewiseGraph:
    """A graph cut into pieces; calling it runs the pieces in order."""

    module: fx.GraphModule
    pieces: list[Piece]
    reports: list[Report] = field(default_factory=list)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    @property
    def split_pieces(self) -> list[Piece]:
        return [p for p in self.pieces if p.is_split]

    def run(
        self, pipeline: Any = None, *, include_split: bool = False, instrument: Any = ()
    ) -> bool:
        """Run ``pipeline`` on every piece (not the splitting ops unless ``include_split``),
        with ``instrument`` attached.

        All or nothing: if a pass fails on any piece, every piece is put back as it was and
        the :class:`~fxpass.PassFailedError` says which piece. Returns whether any changed.
        """
        runner = Runner(resolve_pipeline(pipeline), instrument=instrument)
        targets = [p for p in self.pieces if include_split or not p.is_split]
        saved = [(p, p.module, GraphSnapshot.take(p.module)) for p in targets]
        modified = False
        try:
            for piece in targets:
                result = runner.run(piece.module, graph_sample_inputs(piece.module))
                if result.graph_module is not piece.module:
                    piece.module = result.graph_module
                    setattr(self.module, piece.name, result.graph_module)
                modified |= result.modified
        except PassFailedError as e:
            for piece, module, snap in saved:
                snap.restore()
                piece.module = module
                setattr(self.module, piece.name, module)
            e.args = (f"{e.args[0]}\n  in piece '{piece.name}'; every piece was put back",)
            raise
        self.reports.extend(runner.reports)
        return modified

    def stitch(self) -> fx.GraphModule:
        """One flat GraphModule computing the same as the pieces (the pieces inlined)."""
        return _inline(self.module)

    def compile(
        self,
        compiler: Callable[[fx.GraphModule, list[Any]], Callable[..., Any]],
        *,
        include_split: bool = False,
    ) -> None:
        """Replace each piece by ``compiler(piece, fake_inputs)`` (the split ops stay eager)."""
        for piece in self.pieces:
            if piece.is_split and not include_split:
                continue
            compiled = compiler(piece.module, graph_sample_inputs(piece.module) or [])
            setattr(self.module, piece.name, _Compiled(compiled, piece.name))
        self.module.recompile()

    def __repr__(self) -> str:
        return f"PiecewiseGraph({len(self.pieces)} pieces, {len(self.split_pieces)} split ops)"


class _Compiled(torch.nn.Module):
    """A compiled piece standing where its GraphModule was (call_module needs a Module)."""

    def __init__(self, fn: Callable[..., Any], name: str) -> None:
        super().__init__()
        self.fn = fn
        self.piece = name

    def forward(self, *args: Any) -> Any:
        return self.fn(*args)


def split(gm: fx.GraphModule, at: Any = "attention") -> PiecewiseGraph:
    """Cut ``gm`` at the ops ``at`` names; ``gm`` itself is not changed.

    Each splitting op (with the ``getitem`` nodes that unpack its results) becomes a piece
    of its own; the ops between them form the other pieces, in graph order.
    """
    pieces = _split(gm, split_predicate(at))
    if pieces is None:
        raise _nothing_to_split(at)
    return pieces


def _nothing_to_split(at: Any) -> ValueError:
    return ValueError(
        f"nothing to split at: no node in the graph matches {at!r} "
        "(Dynamo graphs call torch functions, exported and AOT graphs call ATen ops)"
    )


def _split(gm: fx.GraphModule, is_split: Callable[[fx.Node], bool]) -> PiecewiseGraph | None:
    """:func:`split` with the predicate made; None when no node (but the graph's inputs and
    output, which are never asked) is a splitting op."""
    ids: dict[fx.Node, int] = {}
    split_ids: set[int] = set()
    current = 0
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        if node.op == "call_function" and node.target is operator.getitem:
            source = node.args[0]
            if isinstance(source, fx.Node) and ids.get(source) in split_ids:
                ids[node] = ids[source]  # unpacking a split op's tuple stays with it
                continue
        if is_split(node):
            current += 1
            ids[node] = current
            split_ids.add(current)
            current += 1
        else:
            ids[node] = current
    if not split_ids:
        return None
    top = split_module(gm, gm, lambda n: ids[n], keep_original_order=True)
    use_codegen(gm.graph, top.graph, copy_it=True)  # e.g. pytree in/out of ep.module()
    top.recompile()
    pieces = []
    for node in top.graph.nodes:
        if node.op == "call_module":
            index = int(str(node.target).rsplit("_", 1)[1])
            pieces.append(
                Piece(str(node.target), top.get_submodule(node.target), index in split_ids)
            )
    return PiecewiseGraph(top, pieces)


def piecewise(
    gm: fx.GraphModule,
    pipeline: Any = None,
    at: Any = "attention",
    *,
    include_split: bool = False,
) -> PiecewiseGraph:
    """:func:`split` ``gm`` at ``at`` and run ``pipeline`` on every piece."""
    pg = split(gm, at)
    pg.run(pipeline, include_split=include_split)
    return pg


# ----- stitching ---------------------------------------------------------------------------------
def _inline(top: fx.GraphModule) -> fx.GraphModule:
    """A new flat graph of the pieces' nodes (built by an editor that tells nobody: no run
    watches a graph being built)."""
    graph = fx.Graph()
    editor = Editor(None)
    use_codegen(top.graph, graph)
    env: dict[fx.Node, Any] = {}
    attrs: dict[str, Any] = {}

    def lookup(n: fx.Node) -> Any:
        return env[n]

    for node in top.graph.nodes:
        sub = _submodule(top, node)
        if sub is not None:
            args = fx.node.map_arg(node.args, lookup)
            env[node] = _inline_call(graph, sub, args, attrs, editor)
        elif (
            node.op == "call_function"
            and node.target is operator.getitem
            and isinstance(env.get(node.args[0]), (tuple, list))
        ):
            env[node] = env[node.args[0]][node.args[1]]
        elif node.op == "output":
            result = fx.node.map_arg(node.args[0], lookup)
            editor.create(graph, "output", "output", (result,)).meta.update(node.meta)
        else:
            if node.op in ("get_attr", "call_module"):
                attrs[str(node.target)] = get_path(top, str(node.target))
            env[node] = editor.copy(node, lookup, into=graph)
    graph.lint()
    return fx.GraphModule(attrs, graph)


def _submodule(top: fx.GraphModule, node: fx.Node) -> fx.GraphModule | None:
    if node.op != "call_module":
        return None
    sub = top.get_submodule(str(node.target))
    if isinstance(sub, _Compiled):
        raise ValueError("stitch() needs the pieces' graphs; it cannot inline compiled pieces")
    return sub if isinstance(sub, fx.GraphModule) else None


def _inline_call(
    graph: fx.Graph, sub: fx.GraphModule, args: Sequence[Any], attrs: dict, editor: Editor
) -> Any:
    local: dict[fx.Node, Any] = {}
    inputs = iter(args)
    for n in sub.graph.nodes:
        if n.op == "placeholder":
            local[n] = next(inputs)
        elif n.op == "output":
            return fx.node.map_arg(n.args[0], local.__getitem__)
        else:
            if n.op in ("get_attr", "call_module"):
                value = get_path(sub, str(n.target))
                name = _free_name(attrs, str(n.target), value)
                attrs[name] = value
                copy = editor.copy(n, local.__getitem__, into=graph)
                editor.set_target(copy, name, rule="stitch")
                local[n] = copy
            else:
                local[n] = editor.copy(n, local.__getitem__, into=graph)
    raise ValueError(f"piece {sub} has no output node")


def _free_name(attrs: dict[str, Any], name: str, value: Any) -> str:
    candidate, i = name, 0
    while candidate in attrs and attrs[candidate] is not value:
        i += 1
        candidate = f"{name}_{i}"
    return candidate
