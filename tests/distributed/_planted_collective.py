"""A pass with one planted bad collective, and what each rank runs to bisect it; rank
programs with one planted fault (a dropped, mis-shaped, reordered collective) for the
rank consistency check.

``reduce_replicas`` follows every matmul of a graph whose values are the same on every
rank (replicated) with ``all_reduce(max)`` — the value itself, since all ranks hold it —
inserted through the editor (:class:`fxpass.distributed.collectives.Inserter`), one change
per matmul. The planted bug: the third one reduces with ``sum``, which doubles it. Each
rank runs :func:`fxpass.verify.bisect` on the same graph and inputs, so every run of the
search calls the same collectives in the same order on every rank.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

from fxpass.distributed.collectives import C10D, DEFAULT_GROUP, Inserter, all_reduce
from fxpass.edit.editor import Editor

aten = torch.ops.aten
RULE = "reduce_replicas"
PLANTED = 3  # the matmul (1-based) whose all-reduce is wrong


def matmuls(gm: fx.GraphModule) -> list[fx.Node]:
    return [n for n in gm.graph.nodes if n.target is aten.mm.default]


def reduce_replicas(gm: fx.GraphModule) -> bool:
    """all_reduce(max) after each matmul (the planted one: sum), each one change."""
    editor = Editor(pass_name=RULE)
    changed = False
    for i, mm in enumerate(matmuls(gm), 1):
        if not editor.allow():  # the debug counter: one collective is one action
            continue
        with editor.change("insert", RULE, [mm]):
            put = Inserter(editor, RULE, [mm], after=mm)
            reduced = all_reduce(put, mm, DEFAULT_GROUP, "sum" if i == PLANTED else "max")
            first = put.created[0]
            editor.replace_all_uses(mm, reduced, RULE, erase_old=False,
                                    only=lambda u, first=first: u is not first)  # fmt: skip
        changed = True
    return changed


def chain_graph() -> tuple[fx.GraphModule, list[torch.Tensor]]:
    """Five matmuls in a chain (a tanh between each), and inputs every rank draws alike."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x, w):
        for _ in range(5):
            x = torch.tanh(x @ w)
        return (x,)

    gen = torch.Generator().manual_seed(0)
    inputs = [torch.randn(4, 8, generator=gen), torch.randn(8, 8, generator=gen) / 3]
    return make_fx(f)(*inputs), inputs


def bisect_on_rank(rank: int, world_size: int, payload: Any) -> dict[str, Any]:
    from fxpass.verify import bisect

    gm, inputs = chain_graph()
    result = bisect(gm, __name__ + ":reduce_replicas", inputs)
    rw = result.rewrite
    return {
        "ok": result.ok,
        "bad_pass": result.first_bad_pass.name if result.first_bad_pass else None,
        "rewrite": rw.to_dict() if rw is not None else None,
        "matmuls": [n.name for n in matmuls(gm)],
        "text": str(result),
    }


# ----- planted rank faults: one rank's program differs from the others' ------------------------
def _rank_graph(program: Any) -> fx.GraphModule:
    """A copy of a rank's graph module to plant a fault in (the program is left alone)."""
    import copy

    gm = program.graph_module if hasattr(program, "graph_module") else program
    return copy.deepcopy(gm)


def _collectives(gm: fx.GraphModule, target: Any) -> list[fx.Node]:
    return [n for n in gm.graph.nodes if n.target is target]


def drop_collective(program: Any, index: int) -> tuple[fx.GraphModule, str]:
    """The program with its ``index``-th all-reduce (and its wait) removed: the partial sums
    flow on unreduced. Returns the graph and the dropped node's name."""
    gm = _rank_graph(program)
    editor = Editor(pass_name="plant")
    reduce = _collectives(gm, C10D.all_reduce.default)[index]
    (wait,) = reduce.users
    editor.replace_all_uses(wait, reduce.args[0], "plant")
    editor.erase(reduce, "plant")
    gm.recompile()
    return gm, reduce.name


def misshape_collective(program: Any, index: int) -> tuple[fx.GraphModule, str]:
    """The program whose ``index``-th all-reduce sends half its last dim (a slice of what it
    should reduce). Returns the graph and the node's name."""
    gm = _rank_graph(program)
    editor = Editor(pass_name="plant")
    reduce = _collectives(gm, C10D.all_reduce.default)[index]
    x = reduce.args[0]
    half = x.meta["val"].shape[-1] // 2
    cut = editor.insert(aten.slice.Tensor, (x, -1, 0, half), rule="plant", origin=[x],
                        before=reduce, val=x.meta["val"][..., :half])  # fmt: skip
    editor.set_args(reduce, (cut, *reduce.args[1:]), rule="plant")
    gm.recompile()
    return gm, reduce.name


def reduce_op(program: Any, index: int, op: str) -> tuple[fx.GraphModule, str]:
    """The program whose ``index``-th all-reduce reduces with ``op`` instead."""
    gm = _rank_graph(program)
    editor = Editor(pass_name="plant")
    reduce = _collectives(gm, C10D.all_reduce.default)[index]
    editor.set_args(reduce, (reduce.args[0], op, *reduce.args[2:]), rule="plant")
    gm.recompile()
    return gm, reduce.name


def two_collectives(order: str) -> fx.GraphModule:
    """A rank program that all-reduces one input and all-gathers another, in ``order``
    ("reduce first" or "gather first"): two ranks that disagree on the order hang."""
    from torch.fx.experimental.proxy_tensor import make_fx

    c10d = torch.ops._c10d_functional

    def f(a, b):
        if order == "reduce first":
            x = c10d.wait_tensor(c10d.all_reduce(a.sin(), "sum", "0"))
            y = c10d.wait_tensor(c10d.all_gather_into_tensor(b.cos(), 2, "0"))
        else:
            y = c10d.wait_tensor(c10d.all_gather_into_tensor(b.cos(), 2, "0"))
            x = c10d.wait_tensor(c10d.all_reduce(a.sin(), "sum", "0"))
        return (x.sum() + y.sum(),)

    return make_fx(f, tracing_mode="fake")(torch.randn(4, 8), torch.randn(2, 8))


def collective_in_cond(same: bool) -> fx.GraphModule:
    """A program whose ``cond`` all-reduces in its true branch and, unless ``same``, not in
    its false branch (ranks with different predicates would hang)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    c10d = torch.ops._c10d_functional

    def yes(x):
        return c10d.wait_tensor(c10d.all_reduce(x.sin(), "sum", "0"))

    def no(x):
        return c10d.wait_tensor(c10d.all_reduce(x.cos(), "sum", "0")) if same else x.cos()

    def f(x):
        return (torch.cond(x.sum() > 0, yes, no, (x,)),)

    return make_fx(f, tracing_mode="fake")(torch.randn(4, 8))
