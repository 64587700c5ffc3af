"""``bucket_collectives``: adjacent small collectives of one group become one launch.

Each collective costs a launch and a rendezvous whatever its size, so a rank that issues
two small all-reduces back to back — the q and k norms of a distributed RMSNorm, a
shared expert's partial sums next to the routed experts' — pays twice the latency for
bytes that fit in one message. PyTorch's post-grad passes bucket all-gathers and
reduce-scatters the same way (``bucket_all_gather``, ``bucket_reduce_scatter``).

Collectives are *adjacent* when no other collective comes between them in the graph, and
one may join the bucket of the ones before it when it is of the same kind on the same
group (the same reduce op, group size and dtype), at most ``threshold`` bytes, the bucket
stays within ``cap`` bytes, and what it sends does not depend on what the bucket's
members return. A bucket is then one collective on the members' inputs flattened and
concatenated, issued where the last member was, and split back into each member's
result; what read an earlier member's result moves below the bucket (it depended on the
collective, so it could not run before it anyway, and nothing the later members send
reads it). The bytes sent are the same; the launches fewer:

    all_reduce(x.view(-1) ++ y.view(-1)) -> split -> x', y'       (instead of two)

All-reduces, all-gathers and reduce-scatters (dim 0, as :mod:`.collectives` inserts them)
are bucketed; the ranks stay consistent because every rank's program has the same
collectives (:mod:`.consistency`) and the pass decides from shapes alone.
"""

from __future__ import annotations

import torch
from torch import fx

from ..core.context import PassContext
from ..core.pass_registry import REGISTRY
from ..edit.editor import Editor
from ..rewrite.metadata import fake_mode, repropagate
from .collectives import C10D, Inserter
from .plan import DEFAULT_BUCKET
from .strategy import handed_context

__all__ = ["DEFAULT_CAP", "DEFAULT_THRESHOLD", "bucket_collectives", "launches"]

aten = torch.ops.aten
RULE = "bucket_collectives"
#: The largest collective that joins a bucket, and the most bytes per bucket. Not measured
#: on a GPU (none was lent): NCCL's latency-bound regime ends around 64 KiB-1 MiB per
#: message on NVLink; these are the defaults until a crossover is measured.
DEFAULT_THRESHOLD = DEFAULT_BUCKET
DEFAULT_CAP = 1024 * 1024

_KINDS = {
    C10D.all_reduce.default: "all_reduce",
    C10D.all_gather_into_tensor.default: "all_gather",
    C10D.reduce_scatter_tensor.default: "reduce_scatter",
}


def launches(gm: fx.GraphModule) -> int:
    """How many collectives the graph issues per run."""
    from .consistency import trace

    return len(trace(gm)[0])


def _key(node: fx.Node) -> tuple | None:
    """What must match for two collectives to share a bucket, or None when ``node`` cannot
    join one."""
    kind = _KINDS.get(node.target) if node.op == "call_function" else None
    if kind is None or len(node.users) != 1:
        return None
    (wait,) = node.users
    if wait.target is not C10D.wait_tensor.default:
        return None
    val = node.args[0].meta.get("val") if isinstance(node.args[0], fx.Node) else None
    if not isinstance(val, torch.Tensor) or not val.is_contiguous():
        return None
    return (kind, *node.args[1:], val.dtype)


def _nbytes(node: fx.Node) -> int:
    val = node.args[0].meta["val"]
    return val.numel() * val.element_size()


def _depends(node: fx.Node, on: set[fx.Node], since: int, order: dict[fx.Node, int]) -> bool:
    """Whether ``node``'s input reaches any of ``on`` (looking back to position ``since``)."""
    stack, seen = [node.args[0]], set()
    while stack:
        n = stack.pop()
        if not isinstance(n, fx.Node) or n in seen or order[n] < since:
            continue
        if n in on:
            return True
        seen.add(n)
        stack.extend(n.all_input_nodes)
    return False


def _members(bucket: list[fx.Node]) -> set[fx.Node]:
    return {m for c in bucket for m in (c, *c.users)}


def find_buckets(gm: fx.GraphModule, threshold: int, cap: int) -> list[list[fx.Node]]:
    """The buckets of two or more adjacent collectives the pass would merge."""
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    buckets, current, size = [], [], 0
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target not in _KINDS:
            if node.op == "call_function" and _is_other_collective(node):
                buckets.append(current)
                current, size = [], 0
            continue
        key, nbytes = _key(node), 0
        if key is not None:
            nbytes = _nbytes(node)
        joins = (
            current
            and key is not None
            and key == _key(current[0])
            and nbytes <= threshold
            and size + nbytes <= cap
            and not _depends(node, _members(current), order[current[0]], order)
        )
        if joins:
            current.append(node)
            size += nbytes
            continue
        buckets.append(current)
        small = key is not None and nbytes <= threshold
        current, size = ([node], nbytes) if small else ([], 0)
    buckets.append(current)
    return [b for b in buckets if len(b) > 1]


def _is_other_collective(node: fx.Node) -> bool:
    name = str(node.target)
    return ("_c10d_functional" in name and node.target is not C10D.wait_tensor.default) or (
        node.target is torch.ops.fxpass.all_reduce_add_rmsnorm.default
    )


def _merge(editor: Editor, bucket: list[fx.Node]) -> None:
    """One collective for the bucket (see the module docstring)."""
    last = bucket[-1]
    waits = [next(iter(c.users)) for c in bucket]
    kind = _KINDS[last.target]
    put = Inserter(editor, RULE, bucket, before=last)
    vals = [c.args[0].meta["val"] for c in bucket]
    numels = [v.numel() for v in vals]
    if kind == "reduce_scatter":
        n = int(last.args[2])
        parts = [put(aten.view.default, c.args[0], [n, v.numel() // n])
                 for c, v in zip(bucket, vals, strict=True)]  # fmt: skip
        joined = put(aten.view.default, put(aten.cat.default, parts, 1), [-1])
        merged = put(C10D.reduce_scatter_tensor.default, joined, *last.args[1:])
        sizes = [m // n for m in numels]
    else:
        flat = [put(aten.view.default, c.args[0], [-1]) for c in bucket]
        joined = put(aten.cat.default, flat, 0)
        merged = put(last.target, joined, *last.args[1:])
        sizes = numels
    done = put(C10D.wait_tensor.default, merged)
    if kind == "all_gather":
        n = int(last.args[1])
        done = put(aten.view.default, done, [n, sum(numels)])
    results, offset = [], 0
    for v, size in zip(vals, sizes, strict=True):
        if kind == "all_gather":
            cut = put(aten.slice.Tensor, done, 1, offset, offset + size)
            cut = put(aten.clone.default, cut, memory_format=torch.contiguous_format)
            shape = [v.shape[0] * n, *v.shape[1:]]
        else:
            cut = put(aten.slice.Tensor, done, 0, offset, offset + size)
            shape = [v.shape[0] // n, *v.shape[1:]] if kind == "reduce_scatter" else list(v.shape)
        results.append(put(aten.view.default, cut, [int(s) for s in shape]))
        offset += size
    # what read an earlier member's result runs after the bucket now
    moved, reached = [], set(waits[:-1])
    node = bucket[0].next
    while node is not last:
        if any(a in reached for a in node.all_input_nodes):
            reached.add(node)
            moved.append(node)
        node = node.next
    anchor = results[-1]
    for node in moved:
        editor.move(node, after=anchor, rule=RULE)
        anchor = node
    for c, wait, result in zip(bucket, waits, results, strict=True):
        editor.replace_all_uses(wait, result, RULE)
        editor.erase(c, RULE)


@REGISTRY.register(
    "bucket_collectives",
    origin="fxpass",
    keeps=("val", "stack_trace", "nn_module_stack", "provenance"),
    statistics={
        "buckets": "buckets of adjacent small collectives merged into one",
        "merged": "collectives merged into buckets",
        "launches_before": "collectives the graph issued before",
        "launches_after": "collectives the graph issues after",
    },
)
def bucket_collectives(
    gm: fx.GraphModule,
    *,
    threshold: int = DEFAULT_THRESHOLD,
    cap: int = DEFAULT_CAP,
    ctx: PassContext | None = None,
) -> bool:
    """Merge adjacent collectives of one kind and group, each at most ``threshold`` bytes
    and at most ``cap`` bytes together, into one (see
    :mod:`fxpass.distributed.bucket_collectives`)."""
    if threshold < 0 or cap < 0:
        raise ValueError(f"bucket_collectives: threshold and cap are bytes >= 0, not "
                         f"{threshold} and {cap}")  # fmt: skip
    before = launches(gm)
    buckets = find_buckets(gm, threshold, cap)
    ctx = handed_context(ctx, RULE)
    editor = ctx.editor
    merged = 0
    for bucket in buckets:
        if not editor.allow():
            continue
        with editor.change("merge", RULE, bucket):
            _merge(editor, bucket)
        merged += len(bucket)
        ctx.stat("buckets")
    ctx.stat("launches_before", before)
    if not merged:
        ctx.stat("launches_after", before)
        return False
    repropagate(gm, fake_mode(gm))
    gm.graph.lint()
    ctx.stat("merged", merged)
    ctx.stat("launches_after", launches(gm))
    return True
