"""An independent reference for :func:`fxpass.verify.check_streams`, for differential tests.

It shares nothing with the checker but the stream ops' meaning. Where the checker reasons
about nodes (which memory a value *may* live in, decided from fake values and schemas), this
reference *runs* the graph on real tensors (``torch.fx.Interpreter``) and watches what each
node did: the storages its tensor inputs live in (read), the storages of results that are
new (written: the node ran a kernel), the inputs whose version counter moved (written in
place). A node that only made views of its inputs ran no kernel. Every value is kept alive
until the end, so no storage address is reused.

The happens-before relation is its own: a vector clock per stream, ``record_event`` takes a
snapshot, ``wait_event`` merges it; every access is checked against *every* earlier
conflicting access of another stream (read after write, write after read or write). A
storage is freed after the last use of the last value holding it; a read on another stream
than the one that allocated it must then be known finished on that stream, or be covered by
a ``record_stream``.

:func:`reference` returns the same normalised findings as :func:`normalise` makes of the
checker's violations: ``{(kind, node name)}``.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx
from torch.utils._pytree import tree_flatten

OPS = torch.ops.fxpass
_STREAM_OPS = {
    OPS.set_stream.default,
    OPS.record_event.default,
    OPS.wait_event.default,
    OPS.record_stream.default,
}
_NEVER = 1 << 60


def normalise(violations) -> set[tuple[str, str]]:
    """The checker's violations as ``(kind, the node the fix is about)``."""
    out = set()
    for v in violations:
        if v.kind == "missing_sync":
            out.add((v.kind, v.nodes[0]))  # the unordered access
        elif v.kind == "freed_early":
            out.add((v.kind, v.nodes[2]))  # the reader on the other stream
        elif v.kind in ("unjoined_output", "ends_on_side_stream"):
            out.add((v.kind, ""))  # (the checker names the last writer per stream, the
            # reference every writer: the kind is what both must see)
        elif v.kind == "unjoined_stream":
            out.add((v.kind, str(v.stream)))
        elif v.kind in ("wait_before_record", "stream_mismatch"):
            out.add((v.kind, v.nodes[0]))
    return out


@dataclass
class _Access:
    stream: int
    tick: int
    node: str
    write: bool


def _tensors(value: Any) -> list[torch.Tensor]:
    return [t for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor)]


def _storage(t: torch.Tensor) -> int | None:
    s = t.untyped_storage()
    return s.data_ptr() if s.nbytes() else None


class _Run(fx.Interpreter):
    def __init__(self, gm: fx.GraphModule) -> None:
        super().__init__(gm, garbage_collect_values=False)
        nodes = list(gm.graph.nodes)
        self.pos = {n: i for i, n in enumerate(nodes)}
        self.last_use = {
            n: max((_NEVER if u.op == "output" else self.pos[u] for u in n.users), default=-1)
            for n in nodes
        }
        self.current = 0
        self.clock: dict[int, dict[int, int]] = {0: {0: 1}}
        self.events: dict[int, dict[int, int]] = {}
        self.history: dict[int, list[_Access]] = {}  # storage -> every access, in order
        self.holders: dict[int, set[fx.Node]] = {}
        self.home: dict[int, int] = {}  # storage -> the stream whose kernel allocated it
        self.external: set[int] = set()
        self.kept: set[tuple[int, int]] = set()
        self.freed: set[int] = set()
        self.last: dict[int, tuple[int, str]] = {}
        self.found: set[tuple[str, str]] = set()

    def vc(self, stream: int) -> dict[int, int]:
        return self.clock.setdefault(stream, {})

    # ----- running -----------------------------------------------------------------------------
    def run_node(self, n: fx.Node) -> Any:
        if n.op == "call_function" and n.target in _STREAM_OPS:
            self.stream_op(n)
            result = super().run_node(n)
        elif n.op == "output":
            self.at_output(n)
            result = super().run_node(n)
        elif n.op in ("placeholder", "get_attr"):
            result = super().run_node(n)
            for t in _tensors(result):
                key = _storage(t)
                if key is not None:
                    self.external.add(key)
                    self.history.setdefault(key, []).append(_Access(0, 1, n.name, True))
        else:
            result = self.compute(n)
        self.hold(n, result)
        self.free_after(n)
        return result

    def compute(self, n: fx.Node) -> Any:
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        ins = _tensors((args, kwargs))
        before = {id(t): t._version for t in ins}
        result = getattr(self, n.op)(n.target, args, kwargs)
        in_keys = {_storage(t) for t in ins} - {None}
        out_keys = {_storage(t) for t in _tensors(result)} - {None}
        fresh = out_keys - in_keys
        bumped = {_storage(t) for t in ins if t._version != before[id(t)]} - {None}
        if n.target is operator.getitem or not (fresh or bumped):
            return result  # a view or a size: no kernel
        s = self.current
        marked = n.meta.get("stream")
        if isinstance(marked, int) and marked != s:
            self.found.add(("stream_mismatch", n.name))
        clock = self.vc(s)
        clock[s] = clock.get(s, 0) + 1
        tick = clock[s]
        self.last[s] = (tick, n.name)
        for key in fresh:
            self.home.setdefault(key, s)
        for key in in_keys - bumped:
            self.access(key, _Access(s, tick, n.name, False))
        for key in fresh | bumped:
            self.access(key, _Access(s, tick, n.name, True))
        return result

    def access(self, key: int, acc: _Access) -> None:
        clock = self.vc(acc.stream)
        for prev in self.history.get(key, ()):
            conflict = prev.write or acc.write
            if conflict and prev.stream != acc.stream and clock.get(prev.stream, 0) < prev.tick:
                self.found.add(("missing_sync", acc.node))
        self.history.setdefault(key, []).append(acc)

    def stream_op(self, n: fx.Node) -> None:
        if n.target is OPS.set_stream.default:
            self.current = n.args[0]
        elif n.target is OPS.record_event.default:
            event, stream = n.args
            self.events[event] = dict(self.vc(stream))
        elif n.target is OPS.wait_event.default:
            event, stream = n.args
            if event not in self.events:
                self.found.add(("wait_before_record", n.name))
                return
            clock = self.vc(stream)
            for s, t in self.events[event].items():
                clock[s] = max(clock.get(s, 0), t)
        else:
            for t in _tensors(self.env[n.args[0]]):
                self.kept.add((_storage(t), n.args[1]))

    def at_output(self, n: fx.Node) -> None:
        if self.current != 0:
            self.found.add(("ends_on_side_stream", ""))
        clock = self.vc(0)
        for t in _tensors(self.fetch_args_kwargs_from_env(n)[0]):
            for prev in self.history.get(_storage(t), ()):
                if prev.write and prev.stream != 0 and clock.get(prev.stream, 0) < prev.tick:
                    self.found.add(("unjoined_output", ""))
        for s, (tick, _) in self.last.items():
            if s != 0 and clock.get(s, 0) < tick:
                self.found.add(("unjoined_stream", str(s)))

    # ----- lifetimes ---------------------------------------------------------------------------
    def hold(self, n: fx.Node, result: Any) -> None:
        for t in _tensors(result):
            key = _storage(t)
            if key is not None:
                self.holders.setdefault(key, set()).add(n)

    def free_after(self, n: fx.Node) -> None:
        at = self.pos[n]
        for key, holders in self.holders.items():
            if key in self.freed or key in self.external or key not in self.home:
                continue
            if max(self.last_use[h] for h in holders) != at:
                continue
            self.freed.add(key)
            home = self.home[key]
            clock = self.vc(home)
            for acc in self.history[key]:
                if acc.stream == home or (key, acc.stream) in self.kept:
                    continue
                if clock.get(acc.stream, 0) < acc.tick:
                    self.found.add(("freed_early", acc.node))


def reference(gm: fx.GraphModule, inputs: list) -> set[tuple[str, str]]:
    """Run ``gm`` on ``inputs`` and return every race it has, as ``(kind, node name)``."""
    run = _Run(gm)
    with torch.no_grad():
        run.run(*inputs)
    return run.found
