"""Record what each pass changed, cheaply enough for 16k-node graphs.

:class:`GraphRecorder` is an instrumentation that keeps one lightweight summary of the graph
(a tuple of references per node, no copies of the graph) and, after each pass that changed
it, diffs the new summary against the last one. Only the changed region is kept: the nodes
added, removed, changed or rewired, grouped into connected *hunks*, each with a one-node
neighbourhood of context, ready to be drawn (:mod:`fxpass.html.render`).

Nodes are matched across passes by name (names are unique for the life of a graph), and by
provenance: a node a rewrite created records the nodes it replaced
(``meta['fxpass_provenance']['replaced']`` and torch's ``meta['from_node']``), so a fused node
is drawn in the same hunk as the nodes it replaced, and a node an interpreter pass re-created
under a new name is recognised as the same node.
"""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx

from ..core.instrument import Instrumentation
from ..fxutil.fx_internals import input_nodes, node_args, node_kwargs

__all__ = ["GraphRecorder", "Hunk", "PassChange", "SubGraph", "diff_graphs", "summarize"]

# A node's summary: (op, target, args, kwargs, input names, val, provenance, from_node, stack,
# module stack). References only: nothing is copied or formatted until it is drawn.
_OP, _TARGET, _ARGS, _KWARGS, _INPUTS, _VAL, _PROV, _FROM, _STACK, _MODULE = range(10)
Summary = dict[str, tuple]


def summarize(gm: fx.GraphModule) -> Summary:
    """Name -> summary tuple for every node of ``gm``, in graph order."""
    out: Summary = {}
    for n in gm.graph.nodes:
        meta = n.meta
        out[n.name] = (
            n.op,
            n.target,
            node_args(n),
            node_kwargs(n),
            tuple(x.name for x in input_nodes(n)),
            meta.get("val"),
            meta.get("fxpass_provenance"),
            meta.get("from_node"),
            meta.get("stack_trace"),
            meta.get("nn_module_stack"),
        )
    return out


# ----- what is drawn --------------------------------------------------------------------------
@dataclass
class SubGraph:
    """The nodes of one side of a hunk (name, status, label lines, details) and the edges."""

    nodes: list[tuple[str, str, list[str], dict[str, Any]]] = field(default_factory=list)
    edges: list[tuple[str, str]] = field(default_factory=list)
    truncated: int = 0  # nodes left out of a very large hunk


@dataclass
class Hunk:
    """One connected changed region, before and after, and how many hunks look just like it."""

    before: SubGraph
    after: SubGraph
    signature: tuple = ()
    like_it: int = 1
    counts: dict[str, int] = field(default_factory=dict)

    def text(self) -> tuple[list[str], list[str]]:
        """The hunk as lines of code, before and after (what the terminal shows)."""
        return (
            [d["code"] for _, status, _, d in self.before.nodes if status != "context"],
            [d["code"] for _, status, _, d in self.after.nodes if status != "context"],
        )


@dataclass
class PassChange:
    """What one run of one pass changed."""

    name: str
    spec: str
    run: int
    nodes_before: int
    nodes_after: int
    added: int = 0
    removed: int = 0
    changed: int = 0
    rewired: int = 0
    hunks: list[Hunk] = field(default_factory=list)
    hunks_total: int = 0
    path: str = ""

    @property
    def label(self) -> str:
        label = self.spec or self.name
        return label if self.run <= 1 else f"{label} (run {self.run})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "pass": self.name,
            "spec": self.spec,
            "run": self.run,
            "nodes_before": self.nodes_before,
            "nodes_after": self.nodes_after,
            "added": self.added,
            "removed": self.removed,
            "changed": self.changed,
            "rewired": self.rewired,
            "hunks": self.hunks_total,
        }


# ----- formatting -----------------------------------------------------------------------------
_DTYPES = {
    torch.float32: "f32",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.float64: "f64",
    torch.int64: "i64",
    torch.int32: "i32",
    torch.int8: "i8",
    torch.uint8: "u8",
    torch.bool: "bool",
}


def _short_target(op: str, target: Any) -> str:
    if op in ("placeholder", "output"):
        return op
    if op == "get_attr":
        return f"get_attr {target}"
    if op == "call_module":
        return f"module {target}"
    if op == "call_method":
        return f".{target}()"
    text = str(target)
    if text.startswith("<"):
        text = getattr(target, "__qualname__", None) or getattr(target, "__name__", text)
    for prefix in ("aten.", "torch.ops."):
        if text.startswith(prefix):
            text = text[len(prefix) :]
    return text.removesuffix(".default")


def _type_text(val: Any) -> str:
    if isinstance(val, torch.Tensor):
        dims = ",".join(str(s) for s in val.shape)
        return f"{_DTYPES.get(val.dtype, str(val.dtype).replace('torch.', ''))}[{dims}]"
    if isinstance(val, (list, tuple)):
        parts = [_type_text(v) for v in val]
        return "(" + ", ".join(p for p in parts if p) + ")" if any(parts) else ""
    if isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool, int, float, bool)):
        return type(val).__name__
    return ""


def _arg_text(a: Any, depth: int = 0) -> str:
    if isinstance(a, fx.Node):
        return a.name
    if isinstance(a, (list, tuple)):
        inner = ", ".join(_arg_text(x, depth + 1) for x in a[:8])
        more = ", ..." if len(a) > 8 else ""
        return f"[{inner}{more}]" if isinstance(a, list) else f"({inner}{more})"
    if isinstance(a, torch.Tensor):
        return f"tensor{_type_text(a)}"
    text = repr(a)
    return text if len(text) < 40 else text[:37] + "..."


def _code(name: str, s: tuple) -> str:
    op, target = s[_OP], s[_TARGET]
    if op == "placeholder":
        return f"{name}: input"
    if op == "output":
        return f"return {_arg_text(s[_ARGS][0] if s[_ARGS] else None)}"
    args = [_arg_text(a) for a in s[_ARGS]]
    args += [f"{k}={_arg_text(v)}" for k, v in (s[_KWARGS] or {}).items()]
    return f"{name} = {_short_target(op, target)}({', '.join(args)})"


def _details(name: str, s: tuple, status: str) -> dict[str, Any]:
    d: dict[str, Any] = {
        "name": name,
        "status": status,
        "op": s[_OP],
        "target": str(s[_TARGET]),
        "type": _type_text(s[_VAL]),
        "code": _code(name, s),
    }
    prov = s[_PROV]
    if isinstance(prov, dict):
        d["provenance"] = {
            k: prov[k] for k in ("rule", "pass", "replaced", "location") if k in prov
        }
    sources = _sources(s)
    if sources:
        d["from_node"] = sources
    if s[_STACK]:
        lines = [ln.strip() for ln in str(s[_STACK]).strip().splitlines() if ln.strip()]
        d["stack"] = " / ".join(lines[-2:])
    if s[_MODULE]:
        with contextlib.suppress(Exception):  # broad: an odd nn_module_stack: no module shown
            d["module"] = list(s[_MODULE].values())[-1][0]
    return d


def _sources(s: tuple) -> list[str]:
    names = []
    prov = s[_PROV]
    if isinstance(prov, dict):
        names.extend(str(x) for x in prov.get("replaced", ()) or ())
    for src in s[_FROM] or ():
        name = getattr(src, "name", None)
        if name and name not in names:
            names.append(name)
    return names


def _label(name: str, s: tuple) -> list[str]:
    lines = [name, _short_target(s[_OP], s[_TARGET])]
    t = _type_text(s[_VAL])
    if t:
        lines.append(t if len(t) <= 40 else t[:37] + "...")
    return lines


# ----- diffing --------------------------------------------------------------------------------
def _norm(a: Any, rename: dict[str, str]) -> Any:
    if isinstance(a, fx.Node):
        return ("%", rename.get(a.name, a.name))
    if isinstance(a, (list, tuple)):
        return (type(a).__name__, *(_norm(x, rename) for x in a))
    if isinstance(a, dict):
        return ("{}", *((k, _norm(v, rename)) for k, v in a.items()))
    if isinstance(a, torch.Tensor):
        return ("tensor", id(a))
    return a


def _same_args(x: tuple, y: tuple, rename: dict[str, str]) -> tuple[bool, bool]:
    """(same op and literals, same inputs) for two summaries of a node."""
    if x[_ARGS] is y[_ARGS] and x[_KWARGS] is y[_KWARGS]:
        return x[_OP] == y[_OP] and x[_TARGET] is y[_TARGET], True
    same_op = x[_OP] == y[_OP] and x[_TARGET] == y[_TARGET]
    try:
        same = _norm(x[_ARGS], {}) == _norm(y[_ARGS], rename) and _norm(x[_KWARGS], {}) == _norm(
            y[_KWARGS], rename
        )
    except Exception:  # broad: arguments that cannot be compared (tensors) are not the same
        same = False
    if same:
        return same_op, True
    inputs_same = x[_INPUTS] == tuple(rename.get(n, n) for n in y[_INPUTS])
    return same_op and _literals(x) == _literals(y), inputs_same


def _literals(s: tuple) -> Any:
    def strip(a: Any) -> Any:
        if isinstance(a, fx.Node):
            return "%"
        if isinstance(a, (list, tuple)):
            return tuple(strip(x) for x in a)
        if isinstance(a, torch.Tensor):
            return ("tensor", id(a))
        return a

    try:
        return strip(s[_ARGS]), tuple((k, strip(v)) for k, v in (s[_KWARGS] or {}).items())
    except Exception:  # broad: arguments that cannot be read: compared as unknown (None)
        return None


class _UnionFind:
    def __init__(self) -> None:
        self.parent: dict[str, str] = {}

    def find(self, x: str) -> str:
        p = self.parent.setdefault(x, x)
        while p != self.parent[p]:
            self.parent[p] = self.parent[self.parent[p]]
            p = self.parent[p]
        self.parent[x] = p
        return p

    def union(self, a: str, b: str) -> None:
        self.parent[self.find(a)] = self.find(b)


def _users(summary: Summary, names: Iterable[str]) -> dict[str, list[str]]:
    wanted = set(names)
    users: dict[str, list[str]] = {n: [] for n in wanted}
    for name, s in summary.items():
        for i in s[_INPUTS]:
            if i in wanted:
                users[i].append(name)
    return users


def diff_summaries(
    before: Summary,
    after: Summary,
    *,
    name: str = "",
    spec: str = "",
    run: int = 1,
    max_hunks: int = 8,
    max_nodes: int = 120,
) -> PassChange:
    """Diff two summaries into a :class:`PassChange` with drawable hunks."""
    change = PassChange(name, spec, run, len(before), len(after))
    added = [n for n in after if n not in before]
    removed = {n for n in before if n not in after}
    # Provenance match: a re-created node (same target) that names one removed source.
    rename: dict[str, str] = {}  # after-name -> before-name
    for n in added:
        srcs = [x for x in _sources(after[n]) if x in removed]
        if len(srcs) == 1 and before[srcs[0]][_TARGET] == after[n][_TARGET]:
            rename[n] = srcs[0]
    status_after: dict[str, str] = {}
    status_before: dict[str, str] = {}
    for n in added:
        if n in rename:
            ok_op, ok_in = _same_args(before[rename[n]], after[n], rename)
            if ok_op and ok_in:
                continue
            status_after[n] = "changed" if not ok_op else "rewired"
            status_before[rename[n]] = status_after[n]
        else:
            status_after[n] = "new"
    for n in removed:
        if n not in rename.values():
            status_before[n] = "removed"
    for n, s in after.items():
        if n in before:
            ok_op, ok_in = _same_args(before[n], s, rename)
            if not ok_op:
                status_after[n] = status_before[n] = "changed"
            elif not ok_in:
                status_after[n] = status_before[n] = "rewired"
    change.added = sum(1 for v in status_after.values() if v == "new")
    change.removed = sum(1 for v in status_before.values() if v == "removed")
    change.changed = sum(1 for v in status_after.values() if v == "changed")
    change.rewired = sum(1 for v in status_after.values() if v == "rewired")
    if not status_after and not status_before:
        return change
    _build_hunks(change, before, after, status_before, status_after, rename, max_hunks, max_nodes)
    return change


def _build_hunks(change, before, after, status_before, status_after, rename, max_hunks, max_nodes):
    back = {v: k for k, v in rename.items()}  # before-name -> after-name
    uf = _UnionFind()

    def key_b(n: str) -> str:  # one identity per node across both graphs: its name after
        return back.get(n, n)

    def key_a(n: str) -> str:
        return n

    rewrite = _rewrite_groups(after, status_after, status_before, key_a, key_b)

    def link(a: str, b: str) -> None:
        # Two rewrites that touch (a fused op feeding the next one along the residual
        # stream) stay two regions; everything else connected is one region.
        ga, gb = rewrite.get(a), rewrite.get(b)
        if ga is None or gb is None or ga == gb:
            uf.union(a, b)

    for n in status_before:
        uf.find(key_b(n))
        for i in before[n][_INPUTS]:
            if i in status_before:
                link(key_b(n), key_b(i))
    for n in status_after:
        uf.find(key_a(n))
        for i in after[n][_INPUTS]:
            if i in status_after:
                link(key_a(n), key_a(i))
        for src in _sources(after[n]):
            if src in status_before:
                link(key_a(n), key_b(src))
    # Rewired-only nodes join the hunk of what they are wired to, never a hunk of their own.
    groups: dict[str, tuple[list[str], list[str]]] = {}
    for n in status_before:
        groups.setdefault(uf.find(key_b(n)), ([], []))[0].append(n)
    for n in status_after:
        groups.setdefault(uf.find(key_a(n)), ([], []))[1].append(n)
    order_b = {n: i for i, n in enumerate(before)}
    order_a = {n: i for i, n in enumerate(after)}
    hunks = []
    for bs, as_ in groups.values():
        statuses = [status_before[n] for n in bs] + [status_after[n] for n in as_]
        if all(s == "rewired" for s in statuses):
            continue
        bs.sort(key=order_b.__getitem__)
        as_.sort(key=order_a.__getitem__)
        pos = order_a[as_[0]] if as_ else order_b[bs[0]]
        hunks.append((pos, bs, as_))
    hunks.sort(key=lambda t: t[0])
    change.hunks_total = len(hunks)
    by_sig: dict[tuple, Hunk] = {}
    users_b = _users(before, {i for _, bs, _ in hunks for i in bs})
    users_a = _users(after, {i for _, _, as_ in hunks for i in as_})
    for _, bs, as_ in hunks:
        sig = (
            tuple(sorted(str(before[n][_TARGET]) + status_before[n] for n in bs)),
            tuple(sorted(str(after[n][_TARGET]) + status_after[n] for n in as_)),
        )
        if sig in by_sig:
            by_sig[sig].like_it += 1
            continue
        if len(by_sig) >= max_hunks:
            continue
        hunk = Hunk(
            before=_side(before, bs, status_before, users_b, order_b, max_nodes),
            after=_side(after, as_, status_after, users_a, order_a, max_nodes),
            signature=sig,
        )
        hunk.counts = {
            s: sum(1 for _, st, _, _ in (*hunk.before.nodes, *hunk.after.nodes) if st == s)
            for s in ("new", "removed", "changed", "rewired")
        }
        by_sig[sig] = hunk
    change.hunks = list(by_sig.values())


def _rewrite_groups(after, status_after, status_before, key_a, key_b) -> dict[str, tuple]:
    """Node identity -> the rewrite that made (or replaced) it, from fxpass provenance."""
    group: dict[str, tuple] = {}
    for n, st in status_after.items():
        prov = after[n][_PROV]
        if st == "new" and isinstance(prov, dict) and prov.get("replaced"):
            g = (prov.get("rule"), tuple(prov["replaced"]))
            group[key_a(n)] = g
            for r in prov["replaced"]:
                if r in status_before:
                    group.setdefault(key_b(r), g)
    for n, st in status_after.items():  # a new getitem belongs to the rewrite it unpacks
        s = after[n]
        if st == "new" and key_a(n) not in group and s[_TARGET] is operator.getitem:
            src = s[_INPUTS][0] if s[_INPUTS] else None
            if src is not None and key_a(src) in group:
                group[key_a(n)] = group[key_a(src)]
    return group


def _side(summary, names, status, users, order, max_nodes) -> SubGraph:
    sub = SubGraph()
    core = names[:max_nodes]
    sub.truncated = len(names) - len(core)
    chosen = dict.fromkeys(core)
    context: dict[str, None] = {}
    for n in core:
        for i in summary[n][_INPUTS]:
            if i not in chosen:
                context[i] = None
        for u in users.get(n, ()):
            if u not in chosen:
                context[u] = None
    keep = set(chosen) | set(context)
    for n in sorted(keep, key=order.__getitem__):
        st = status.get(n, "context") if n in chosen else "context"
        sub.nodes.append((n, st, _label(n, summary[n]), _details(n, summary[n], st)))
    for n in keep:
        for i in summary[n][_INPUTS]:
            if i in keep:
                sub.edges.append((i, n))
    return sub


def diff_graphs(a: fx.GraphModule, b: fx.GraphModule, **kw: Any) -> PassChange:
    """What changed from graph ``a`` to graph ``b`` (``fxpass diff``)."""
    return diff_summaries(summarize(a), summarize(b), **kw)


# ----- recording a run ------------------------------------------------------------------------
class GraphRecorder(Instrumentation):
    """Record, for each pass that changed the graph, the changed region before and after.

    One summary of the graph is kept at a time (references to each node's fields, no
    copies); after a pass that changed the graph the new summary is diffed against it and
    only the hunks to draw are kept: at most ``max_hunks`` distinct ones per pass (hunks
    that look alike are counted, not repeated), each at most ``max_nodes`` nodes.
    """

    def __init__(self, *, max_hunks: int = 8, max_nodes: int = 120) -> None:
        self.max_hunks = max_hunks
        self.max_nodes = max_nodes
        self.changes: list[PassChange] = []
        self.report: Any = None
        self._last: Summary | None = None

    def before_pipeline(self, pipeline, gm, ctx):
        self.changes = []
        self._last = summarize(gm)

    def after_pass(self, record, gm, ctx):
        # ctx.changed, not record.modified: a later round of a fixpoint that changed nothing
        # this time has nothing to diff
        if record.children or not ctx.changed or self._last is None:
            return
        now = summarize(gm)
        change = diff_summaries(
            self._last,
            now,
            name=record.name,
            spec=record.spec,
            run=record.runs,
            max_hunks=self.max_hunks,
            max_nodes=self.max_nodes,
        )
        self._last = now
        if change.hunks_total or change.added or change.removed or change.changed:
            change.path = "/".join([*ctx.pass_path, record.name])
            self.changes.append(change)

    def after_pipeline(self, pipeline, gm, report, ctx):
        self.report = report
        self._last = None
