"""A pass with one planted bad collective, and what each rank runs to bisect it.

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

from fxpass.distributed.collectives import DEFAULT_GROUP, Inserter, all_reduce
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
