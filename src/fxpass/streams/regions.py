"""Independent regions of a dataflow graph: where work could run on two streams at once.

A *region* starts at a fork (a value several nodes read) and ends at its join: the first
node every path from the fork goes through (its immediate post-dominator). The nodes in
between that depend on the fork and feed the join split into connected pieces — the
*branches*. No path leads from one branch to another, so they are independent and may
run concurrently. Found on real models:

=================== ====================================================================
kind                branches
=================== ====================================================================
``moe``             the routed experts (router, top-k, experts, weighted sum) and the shared
                    expert(s) of a mixture-of-experts block
``qkv``             the q, k and v projections (with their norms and rotary embedding),
                    joined by attention
``parallel_block``  attention and MLP of a GPT-J / Phi-style block that reads one norm
``branches``        any other independent computations (e.g. an MLP's gate and up
                    projections)
=================== ====================================================================

Regions are found outermost first and do not overlap: the branches of an MoE block are not
split again into its experts. Nodes that hang off a branch and have no users (export's
``_assert_tensor_metadata``) travel with it.
"""

from __future__ import annotations

import operator
from collections import Counter
from dataclasses import dataclass, field

import torch
from torch import fx

from ..edit.alias import is_kernel
from ..fxutil.dialect import aten_op

__all__ = [
    "Branch",
    "Region",
    "find_regions",
    "is_collective",
    "is_random",
    "module_path",
    "walk",
]

_ATTENTION = (
    "scaled_dot_product_attention",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
)
_MATMUL = ("mm", "addmm", "bmm", "baddbmm", "matmul", "linear")
_ROUTING = ("topk", "sort", "argsort")
_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "query", "key", "value")


@dataclass(eq=False)
class Branch:
    """One independent piece of a region: its nodes in graph order and a readable label."""

    nodes: list[fx.Node]
    label: str = ""

    def kernels(self) -> list[fx.Node]:
        return [n for n in self.nodes if is_kernel(n)]


@dataclass(eq=False)
class Region:
    """A fork, its join, and the independent branches between them."""

    fork: fx.Node
    join: fx.Node
    branches: list[Branch] = field(default_factory=list)
    kind: str = "branches"
    inner: list[Region] = field(default_factory=list)  # regions inside one of the branches

    def nodes(self) -> list[fx.Node]:
        return [n for b in self.branches for n in b.nodes]

    def __repr__(self) -> str:
        labels = ", ".join(b.label for b in self.branches)
        return f"Region({self.kind}: {self.fork.name} -> {self.join.name}; {labels})"


def _op_name(node: fx.Node) -> str:
    if node.op == "call_method":
        return str(node.target)
    target = aten_op(node.target)
    packet = getattr(target, "_overloadpacket", None)
    return getattr(packet or target, "__name__", str(target))


def module_path(node: fx.Node) -> str:
    """The innermost module ``node`` came from (``nn_module_stack``), or ``""``."""
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return ""
    path = list(stack.values())[-1]
    return str(path[0] if isinstance(path, tuple) else path)


def _dangling(node: fx.Node) -> bool:
    return not node.users and node.op != "output"


def _meet(ipdom: dict, pos: dict, a: fx.Node | None, b: fx.Node | None) -> fx.Node | None:
    """The nearest common post-dominator of ``a`` and ``b`` (None: only the exit)."""
    while a is not b:
        if a is None or b is None:
            return None
        if pos[a] < pos[b]:
            a = ipdom.get(a)
        else:
            b = ipdom.get(b)
    return a


def _post_dominators(
    nodes: list[fx.Node], pos: dict[fx.Node, int], within: set[fx.Node] | None = None
) -> dict[fx.Node, fx.Node]:
    """Immediate post-dominator of each node (absent: only the exit post-dominates it).
    With ``within``, edges leaving that set lead to the exit."""
    ipdom: dict[fx.Node, fx.Node] = {}
    for node in reversed(nodes):
        users = [u for u in node.users if not _dangling(u)]
        if not users or any(u.op == "output" or (within and u not in within) for u in users):
            continue
        d: fx.Node | None = users[0]
        for u in users[1:]:
            d = _meet(ipdom, pos, d, u)
        if d is not None:
            ipdom[node] = d
    return ipdom


def _between(fork: fx.Node, join: fx.Node, pos: dict[fx.Node, int]) -> set[fx.Node]:
    """Nodes that depend on ``fork`` and feed ``join``."""
    lo, hi = pos[fork], pos[join]
    down, stack = set(), [fork]
    while stack:
        for u in stack.pop().users:
            if pos[u] < hi and u not in down:
                down.add(u)
                stack.append(u)
    up, stack = set(), [join]
    while stack:
        for i in stack.pop().all_input_nodes:
            if pos[i] > lo and i not in up:
                up.add(i)
                stack.append(i)
    return down & up


def _components(nodes: set[fx.Node], pos: dict[fx.Node, int]) -> list[list[fx.Node]]:
    parent = {n: n for n in nodes}

    def find(n: fx.Node) -> fx.Node:
        while parent[n] is not n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    for n in nodes:
        for i in n.all_input_nodes:
            if i in parent:
                parent[find(i)] = find(n)
    groups: dict[fx.Node, list[fx.Node]] = {}
    for n in sorted(nodes, key=pos.__getitem__):
        groups.setdefault(find(n), []).append(n)
    return list(groups.values())


def _attach_dangling(branch: list[fx.Node], pos: dict[fx.Node, int], taken: set) -> list[fx.Node]:
    extra = [u for n in branch for u in n.users if _dangling(u) and u not in taken]
    taken.update(extra)
    return sorted({*branch, *extra}, key=pos.__getitem__)


def _common_prefix(paths: list[str]) -> str:
    parts = [p.split(".") for p in paths if p]
    if not parts:
        return ""
    out = []
    for items in zip(*parts):
        if len(set(items)) != 1:
            break
        out.append(items[0])
    return ".".join(out)


def _typical_prefix(paths: list[str], whole: str) -> str:
    """The deepest module path most (60%) of a branch's kernels share, if more specific
    than what the whole region shares."""
    counts: Counter[str] = Counter()
    for p in paths:
        parts = p.split(".") if p else []
        counts.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    common = [p for p, c in counts.items() if c >= 0.6 * len(paths) and len(p) > len(whole)]
    return max(common, key=lambda p: p.count("."), default="")


def _label(region: Region) -> None:
    names = [Counter(_op_name(n) for n in b.kernels()) for b in region.branches]
    attention = [  # an attention op, or its decomposition (two batched products, a softmax)
        any(c[a] for a in _ATTENTION) or (c["bmm"] >= 2 and (c["_softmax"] or c["softmax"]))
        for c in names
    ]
    matmul = [any(names[i][m] for m in _MATMUL) for i in range(len(names))]
    routed = [any(names[i][r] for r in _ROUTING) for i in range(len(names))]
    paths = [[module_path(n) for n in b.kernels()] for b in region.branches]
    whole = _common_prefix([p for ps in paths for p in ps])
    for branch, ps in zip(region.branches, paths):
        own = _typical_prefix(ps, whole)
        first = next((p for p in ps if p), "")
        branch.label = own or first or branch.kernels()[0].name
    if any(routed) and not all(routed):
        region.kind = "moe"
        for branch, is_routed in zip(region.branches, routed):
            role = "routed experts" if is_routed else "shared expert"
            branch.label = f"{role} ({branch.label})"
    elif any(attention) and any(m and not a for m, a in zip(matmul, attention)):
        region.kind = "parallel_block"
    elif sum(matmul) >= 2 and (
        _op_name(region.join) in _ATTENTION
        or any(b.label.endswith(_PROJECTIONS) for b in region.branches)
    ):
        region.kind = "qkv"


def _region(fork: fx.Node, join: fx.Node, pos: dict[fx.Node, int]) -> Region | None:
    inner = _between(fork, join, pos)
    pieces = [c for c in _components(inner, pos) if any(is_kernel(n) for n in c)]
    if len(pieces) < 2:
        return None
    taken = set(inner)
    region = Region(fork, join, [Branch(_attach_dangling(c, pos, taken)) for c in pieces])
    _label(region)
    return region


def _split_again(region: Region, pos: dict[fx.Node, int]) -> None:
    """A branch the fork enters through several nodes may itself split before the join (q
    and k meet at their product, then join v at the attention): those become inner regions."""
    fork = region.fork
    for branch in region.branches:
        members = set(branch.nodes)
        entries = [u for u in fork.users if u in members]
        if len(entries) < 2:
            continue
        ipdom = _post_dominators(branch.nodes, pos, members)
        join = entries[0]
        for u in entries[1:]:
            join = _meet(ipdom, pos, join, u)
        sub = _region(fork, join, pos) if join is not None else None
        if sub is not None and set(sub.nodes()) <= members:
            region.inner.append(sub)
            _split_again(sub, pos)


def find_regions(gm: fx.GraphModule | fx.Graph) -> list[Region]:
    """The independent regions of ``gm`` with at least two branches that run kernels, in
    graph order. Regions inside a branch of another are in its ``inner`` list (a planner
    that does not split the outer one may split those). Where two regions overlap without
    nesting, the larger one wins (the rope's ``cos`` feeding q and k must not cut the q/k
    region in two)."""
    graph = gm.graph if isinstance(gm, fx.GraphModule) else gm
    nodes = list(graph.nodes)
    pos = {n: i for i, n in enumerate(nodes)}
    ipdom = _post_dominators(nodes, pos)
    candidates = []
    for fork in nodes:
        join = ipdom.get(fork)
        if join is None or fork.target is operator.getitem:
            continue
        if sum(1 for u in fork.users if not _dangling(u)) >= 2:
            region = _region(fork, join, pos)
            if region is not None:
                candidates.append(region)
    candidates.sort(key=lambda r: (-len(r.nodes()), pos[r.fork]))
    owner: dict[fx.Node, tuple[Region, Branch]] = {}  # the innermost region/branch of a node
    regions: list[Region] = []
    for region in candidates:
        outer = {owner.get(n) for n in region.nodes()}
        if len(outer) != 1:
            continue  # overlaps a region without nesting in one of its branches
        (parent,) = outer
        if parent is not None and not set(region.nodes()) <= set(parent[1].nodes):
            continue
        _split_again(region, pos)
        (parent[0].inner if parent else regions).append(region)
        for r in walk([region]):
            for branch in r.branches:
                owner.update(dict.fromkeys(branch.nodes, (r, branch)))
    for r in walk(regions):
        r.inner.sort(key=lambda x: pos[x.fork])
    return sorted(regions, key=lambda r: pos[r.fork])


def walk(regions: list[Region]):
    """Every region and the regions inside it, outermost first."""
    for region in regions:
        yield region
        yield from walk(region.inner)


def is_collective(node: fx.Node) -> bool:
    """A communication op (``torch.distributed`` functional collectives and friends)."""
    target = aten_op(node.target)
    namespace = getattr(target, "namespace", "") or ""
    module = getattr(target, "__module__", "") or ""
    return namespace in ("_c10d_functional", "c10d_functional", "c10d", "_dtensor") or (
        module.startswith("torch.distributed")
    )


def is_random(node: fx.Node) -> bool:
    target = aten_op(node.target)
    return isinstance(target, torch._ops.OpOverload) and (
        torch.Tag.nondeterministic_seeded in target.tags
    )
