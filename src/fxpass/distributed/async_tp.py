"""``async_tp``: overlap the collectives of sequence parallelism with the matmuls next to them.

Under sequence parallelism (:mod:`.sequence_parallel`) every column-parallel projection
reads an all-gather of the tokens and every row-parallel one feeds a reduce-scatter: the
matmul waits for the whole collective, or the collective for the whole matmul. Async
tensor parallelism (PyTorch's ``micro_pipeline_tp``, vLLM's AsyncTP pass) splits both into
``chunks`` so that one chunk's communication runs while the next chunk computes:

* **all-gather -> matmul**: this rank's tokens are cut into ``chunks`` row blocks, each
  all-gathered on its own (all issued at once); the matmul runs per chunk as soon as that
  chunk's wait returns, and the chunks' results are stacked back into token order;
* **matmul -> reduce-scatter**: the matmul's rows are taken chunk by chunk — for each
  chunk, every rank's destination rows of that chunk — so each chunk's product can be
  reduce-scattered at once while the next is computed; the waits come after the last
  chunk, and the pieces are concatenated into this rank's tokens.

The collectives are torch's functional ones; each output is read only after its own
``wait_tensor`` (the happens-before rule the stream checker enforces where streams are
used), and every rank cuts the same chunks, so the ranks stay consistent
(:mod:`.consistency`). A site whose tokens ``ranks x chunks`` does not divide is left as
it was. Eager gloo runs the chunks one after another (the outputs equal the unchunked
program's to rounding); the overlap itself pays on GPUs with NCCL, not measured here.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import fx

from ..core.context import PassContext
from ..core.pass_registry import REGISTRY
from ..edit.editor import Editor
from ..rewrite.metadata import fake_mode, repropagate
from ..verify.streams import require_safe_streams
from .collectives import C10D, Inserter
from .strategy import handed_context

__all__ = ["async_tp"]

aten = torch.ops.aten
RULE = "async_tp"
_VIEWS = {aten.view.default, aten.reshape.default, aten._unsafe_view.default}
_MATMULS = {aten.mm.default, aten.addmm.default, aten.linear.default}


def _shape(node: Any) -> list[int]:
    return [int(s) for s in node.meta["val"].shape]


def _rows(shape: list[int]) -> int:
    return math.prod(shape[:-1])


def _matmul_input(mm: fx.Node) -> fx.Node:
    return mm.args[1] if mm.target is aten.addmm.default else mm.args[0]


def _with_input(put: Inserter, mm: fx.Node, x: fx.Node) -> fx.Node:
    """``mm`` computed on the rows ``x`` (2-D) instead of its input."""
    if mm.target is aten.addmm.default:
        return put(aten.addmm.default, mm.args[0], x, *mm.args[2:], **mm.kwargs)
    return put(mm.target, x, *mm.args[1:], **mm.kwargs)


# ----- matmul -> reduce-scatter ------------------------------------------------------------------
def _matmul_feeding(rs: fx.Node) -> fx.Node | None:
    """The matmul whose rows ``rs`` reduce-scatters, through views only (rows in order)."""
    node = rs.args[0]
    while isinstance(node, fx.Node) and node.target in _VIEWS and len(node.users) == 1:
        node = node.args[0]
    if not isinstance(node, fx.Node) or node.target not in _MATMULS or len(node.users) != 1:
        return None
    out, sent = _shape(node), _shape(rs.args[0])
    if _rows(out) != sent[0] or math.prod(sent[1:]) != out[-1]:
        return None
    return node


def _split_matmul_reduce_scatter(editor: Editor, rs: fx.Node, mm: fx.Node, chunks: int) -> bool:
    (wait,) = rs.users
    n = int(rs.args[2])
    sent = _shape(rs.args[0])
    tokens, x = sent[0], _matmul_input(mm)
    if tokens % (n * chunks):
        return False
    r = tokens // (n * chunks)
    k = _shape(x)[-1]
    put = Inserter(editor, RULE, [mm, rs], before=rs)
    contiguous = x.meta["val"].is_contiguous()
    blocks = put(aten.view.default if contiguous else aten.reshape.default, x,
                 [n, chunks, r, k])  # fmt: skip
    pending = []
    for c in range(chunks):
        rows = put(aten.select.int, blocks, 1, c)  # every rank's rows of chunk c
        rows = put(aten.clone.default, rows, memory_format=torch.contiguous_format)
        part = _with_input(put, mm, put(aten.view.default, rows, [n * r, k]))
        part = put(aten.view.default, part, [n * r, *sent[1:]])
        pending.append(put(C10D.reduce_scatter_tensor.default, part, *rs.args[1:]))
    done = [put(C10D.wait_tensor.default, p) for p in pending]  # after the last chunk
    mine = put(aten.cat.default, done, 0)
    editor.replace_all_uses(wait, mine, RULE)
    editor.erase(rs, RULE)
    editor.erase_all(_chain(mm), RULE)
    return True


def _chain(mm: fx.Node) -> list[fx.Node]:
    """``mm`` and the views after it that nothing reads any more."""
    out, node = [mm], mm
    while len(node.users) == 1:
        (node,) = node.users
        out.append(node)
    return out


# ----- all-gather -> matmul ----------------------------------------------------------------------
def _matmuls_reading(wait: fx.Node) -> list[tuple[fx.Node, list[fx.Node]]] | None:
    """Every matmul that reads the gathered rows through views: (matmul, views); None when
    anything else reads them."""
    found, stack = [], [(u, []) for u in wait.users]
    while stack:
        node, views = stack.pop()
        if node.target in _VIEWS:
            stack.extend((u, [*views, node]) for u in node.users)
        elif node.target in _MATMULS and views and _matmul_input(node) is views[-1]:
            if len(_shape(views[-1])) != 2 and node.target is not aten.linear.default:
                return None
            found.append((node, views))
        else:
            return None
    return found


def _split_all_gather_matmul(editor: Editor, ag: fx.Node, chunks: int) -> bool:
    (wait,) = ag.users
    readers = _matmuls_reading(wait)
    local = _shape(ag.args[0])
    n = int(ag.args[1])
    if not readers or local[0] % chunks:
        return False
    r = local[0] // chunks
    k = _shape(readers[0][1][-1])[-1]
    if (r * math.prod(local[1:])) % k:
        return False
    put = Inserter(editor, RULE, [ag], before=ag)
    pieces = []
    for c in range(chunks):  # all issued at once
        piece = put(aten.slice.Tensor, ag.args[0], 0, c * r, (c + 1) * r)
        pieces.append(put(C10D.all_gather_into_tensor.default, piece, *ag.args[1:]))
    waits: list[fx.Node] = []
    for mm, _views in sorted(readers, key=lambda p: _order(p[0])):
        put = Inserter(editor, RULE, [mm, ag], before=mm)
        parts = []
        for c in range(chunks):
            if len(waits) <= c:  # chunk c's wait, right before its first matmul
                waits.append(put(C10D.wait_tensor.default, pieces[c]))
            rows = put(aten.view.default, waits[c], [-1, k])
            out = _with_input(put, mm, rows)
            parts.append(put(aten.view.default, out, [n, -1, _shape(mm)[-1]]))
        stacked = put(aten.stack.default, parts, 1)  # [ranks, chunks, rows, out]
        full = put(aten.view.default, stacked, _shape(mm))
        editor.replace_all_uses(mm, full, RULE)
    editor.erase_all([*_users_closure(wait), wait, ag], RULE)
    return True


def _order(node: fx.Node) -> int:
    return next(i for i, n in enumerate(node.graph.nodes) if n is node)


def _users_closure(node: fx.Node) -> list[fx.Node]:
    out, stack = [], list(node.users)
    while stack:
        n = stack.pop()
        if n not in out:
            out.append(n)
            stack.extend(n.users)
    return out


@REGISTRY.register(
    "async_tp",
    origin="fxpass",
    keeps=("val", "stack_trace", "nn_module_stack", "provenance"),
    statistics={
        "all_gather_matmul": "all-gathers split into chunks feeding their matmuls",
        "matmul_reduce_scatter": "matmuls split into chunks each reduce-scattered at once",
        "chunks": "chunks per site",
    },
)
def async_tp(gm: fx.GraphModule, *, chunks: int = 2, ctx: PassContext | None = None) -> bool:
    """Split each all-gather -> matmul and matmul -> reduce-scatter into ``chunks`` so
    communication overlaps compute (see :mod:`fxpass.distributed.async_tp`)."""
    if chunks < 2:
        raise ValueError(f"async_tp: chunks must be at least 2, not {chunks}")
    ctx = handed_context(ctx, RULE)
    editor = ctx.editor
    changed = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or len(node.users) != 1:
            continue
        (wait,) = node.users
        if wait.target is not C10D.wait_tensor.default:
            continue
        if node.target is C10D.reduce_scatter_tensor.default:
            mm = _matmul_feeding(node)
            if mm is None or not editor.allow():
                continue
            with editor.change("replace", RULE, [mm, node]):
                done = _split_matmul_reduce_scatter(editor, node, mm, chunks)
            if done:
                ctx.stat("matmul_reduce_scatter")
                changed += 1
        elif node.target is C10D.all_gather_into_tensor.default and editor.allow():
            with editor.change("replace", RULE, [node]):
                done = _split_all_gather_matmul(editor, node, chunks)
            if done:
                ctx.stat("all_gather_matmul")
                changed += 1
    if not changed:
        return False
    ctx.stat("chunks", chunks)
    repropagate(gm, fake_mode(gm))
    gm.graph.lint()
    require_safe_streams(gm)  # a graph on several streams must still order every read
    return True
