"""Patterns as data for the rewrite fuzzers: a connected piece of an ATen graph (or a made-up
one) as a pattern function of ATen calls, and a replacement computing the same values with
some ops spelled another exact way. Both print as source (what a repro shows) and shrink."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import torch
from torch import fx

aten = torch.ops.aten

__all__ = ["Cut", "PNode", "cut_from_graph", "made_up_cut"]


# An argument is ("ref", name), ("lit", source) or ("list", (args...)).
@dataclasses.dataclass(frozen=True)
class PNode:
    name: str
    target: str  # "aten.add.Tensor"
    args: tuple
    kwargs: tuple  # ((key, arg), ...)


@dataclasses.dataclass(frozen=True)
class Cut:
    """A pattern function's parameters and nodes (the last is the root), for each node
    whether the replacement spells it another way, and the inner nodes it also returns
    (the rule's extra outputs: values used outside the match)."""

    params: tuple[str, ...]
    nodes: tuple[PNode, ...]
    spell: tuple[bool, ...]
    extra: tuple[str, ...] = ()

    @property
    def returned(self) -> str:
        return ", ".join((self.root, *self.extra)) if self.extra else self.root

    def pattern_source(self) -> str:
        return _function("pattern", self.params, [_call(n) for n in self.nodes], self.returned)

    def replacement_source(self) -> str:
        lines: list[str] = []
        for node, alt in zip(self.nodes, self.spell):
            lines.extend(_respelled(node) if alt else [_call(node)])
        return _function("replacement", self.params, lines, self.returned)

    @property
    def root(self) -> str:
        return self.nodes[-1].name

    def terminates(self) -> bool:
        """Whether rewriting to a fixpoint must stop: the replacement calls no op of the
        pattern's root, so it cannot be the root of a new match."""
        target = self.nodes[-1].target
        return f"= {target}(" not in self.replacement_source()

    def functions(self) -> tuple[Any, Any]:
        env: dict[str, Any] = {"torch": torch, "aten": aten}
        exec(self.pattern_source() + self.replacement_source(), env)
        return env["pattern"], env["replacement"]

    def shrinks(self) -> list[Cut]:
        """Smaller patterns: fewer outputs; a node other than the root made a parameter; no
        respelling."""
        out = []
        if self.extra:
            out.append(dataclasses.replace(self, extra=()).used())
        if any(self.spell):
            out.append(dataclasses.replace(self, spell=(False,) * len(self.nodes)))
        for i in range(len(self.nodes) - 1):
            gone = self.nodes[i].name
            fresh = f"p{1 + max((int(p[1:]) for p in self.params), default=-1)}"
            nodes = tuple(_rename(n, gone, fresh) for n in self.nodes[i + 1 :])
            cut = Cut(
                (*self.params, fresh),
                self.nodes[:i] + nodes,
                self.spell[:i] + self.spell[i + 1 :],
                tuple(e for e in self.extra if e != gone),
            )
            out.append(cut.used())
        return out

    def used(self) -> Cut:
        """Without nodes and parameters the returned values do not need."""
        need = {self.root, *self.extra}
        keep = []
        for node, alt in reversed(list(zip(self.nodes, self.spell))):
            if node.name in need:
                keep.append((node, alt))
                need.update(_refs(node))
        keep.reverse()
        params = tuple(p for p in self.params if p in need)
        return Cut(params, tuple(n for n, _ in keep), tuple(a for _, a in keep), self.extra)


def _refs(node: PNode) -> set[str]:
    out: set[str] = set()

    def visit(a: Any) -> None:
        if a[0] == "ref":
            out.add(a[1])
        elif a[0] == "list":
            for x in a[1]:
                visit(x)

    for a in node.args:
        visit(a)
    for _, a in node.kwargs:
        visit(a)
    return out


def _rename(node: PNode, old: str, new: str) -> PNode:
    def sub(a: Any) -> Any:
        if a[0] == "ref":
            return ("ref", new) if a[1] == old else a
        if a[0] == "list":
            return ("list", tuple(sub(x) for x in a[1]))
        return a

    return dataclasses.replace(
        node,
        args=tuple(sub(a) for a in node.args),
        kwargs=tuple((k, sub(a)) for k, a in node.kwargs),
    )


def _arg_source(a: Any) -> str:
    if a[0] == "list":
        return "[" + ", ".join(_arg_source(x) for x in a[1]) + "]"
    return a[1]


def _call(node: PNode, name: str | None = None, target: str | None = None, args=None) -> str:
    parts = [_arg_source(a) for a in (node.args if args is None else args)]
    parts += [f"{k}={_arg_source(a)}" for k, a in node.kwargs]
    return f"{name or node.name} = {target or node.target}({', '.join(parts)})"


def _respelled(node: PNode) -> list[str]:
    """``node``'s value computed another way, bit for bit."""
    args, t = node.args, node.target
    refs = len(args) == 2 and all(a[0] == "ref" for a in args) and not node.kwargs
    if t in ("aten.add.Tensor", "aten.mul.Tensor") and refs:
        return [_call(node, args=(args[1], args[0]))]
    if t == "aten.sub.Tensor" and len(args) == 2 and not node.kwargs:
        if args[1][0] == "ref":
            neg = f"{node.name}_neg"
            return [
                f"{neg} = aten.neg.default({args[1][1]})",
                _call(node, target="aten.add.Tensor", args=(args[0], ("ref", neg))),
            ]
        return [_call(node, target="aten.add.Tensor", args=(args[0], ("lit", f"-({args[1][1]})")))]
    if t == "aten.neg.default" and not node.kwargs:
        return [_call(node, target="aten.mul.Tensor", args=(args[0], ("lit", "-1.0")))]
    if t == "aten.relu.default" and not node.kwargs:
        return [_call(node, target="aten.clamp_min.default", args=(args[0], ("lit", "0.0")))]
    return [_call(node)]


def _function(name: str, params: tuple[str, ...], lines: list[str], root: str) -> str:
    body = "".join(f"    {line}\n" for line in lines)
    return f"def {name}({', '.join(params)}):\n{body}    return {root}\n"


def _literal(v: Any) -> str:
    if isinstance(v, torch.dtype):
        return f"torch.{str(v).split('.')[-1]}"
    if isinstance(v, (torch.layout, torch.memory_format)):
        return str(v)
    if isinstance(v, torch.device):
        return f"torch.device({str(v)!r})"
    if isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))):
        return f"float({str(v)!r})"
    if isinstance(v, (list, tuple)):
        inner = ", ".join(_literal(x) for x in v)
        return f"[{inner}]" if isinstance(v, list) else f"({inner}{',' if len(v) == 1 else ''})"
    return repr(v)


def _target_name(target: Any) -> str | None:
    if not isinstance(target, torch._ops.OpOverload):
        return None
    ns, rest = str(target).split(".", 1)
    return f"{ns}.{rest}" if ns == "aten" else None


def _cuttable(n: fx.Node) -> bool:
    return (
        n.op == "call_function"
        and _target_name(n.target) is not None
        and n.target is not aten._assert_tensor_metadata.default
    )


def cut_from_graph(graph: fx.Graph, rng: random.Random, size: int) -> Cut | None:
    """A connected subprogram of ``graph`` rooted at a random node, as a :class:`Cut`."""
    candidates = [n for n in graph.nodes if _cuttable(n)]
    if not candidates:
        return None
    # roots late in the graph more often: they have ancestors to grow into
    chosen = [candidates[max(rng.randrange(len(candidates)), rng.randrange(len(candidates)))]]
    contained_only = rng.random() < 0.6  # often a cut torch's containment rule accepts
    while len(chosen) < size:
        inside = set(chosen)
        frontier = [
            i for n in chosen for i in n.all_input_nodes if i not in inside and _cuttable(i)
        ]
        contained = [i for i in frontier if all(u in inside for u in i.users)]
        if contained_only and contained:
            frontier = contained
        if not frontier:
            break
        chosen.append(rng.choice(frontier))
    order = {n: i for i, n in enumerate(graph.nodes)}
    chosen.sort(key=order.__getitem__)
    names = {n: f"n{i}" for i, n in enumerate(chosen)}
    params: dict[fx.Node, str] = {}

    def arg(a: Any) -> Any:
        if isinstance(a, fx.Node):
            if a in names:
                return ("ref", names[a])
            params.setdefault(a, f"p{len(params)}")
            return ("ref", params[a])
        if isinstance(a, (list, tuple)) and any(isinstance(x, fx.Node) for x in a):
            return ("list", tuple(arg(x) for x in a))
        return ("lit", _literal(a))

    nodes = tuple(
        PNode(
            names[n],
            _target_name(n.target),
            tuple(arg(a) for a in n.args),
            tuple((k, arg(v)) for k, v in n.kwargs.items()),
        )
        for n in chosen
    )
    spell = tuple(rng.random() < 0.5 for _ in nodes)
    escaping = [
        names[n] for n in chosen[:-1] if any(u not in names for u in n.users) and rng.random() < 0.7
    ]
    return Cut(tuple(params.values()), nodes, spell, tuple(escaping))


_UNARY = ("aten.neg.default", "aten.relu.default", "aten.exp.default", "aten.rsqrt.default")
_BINARY = ("aten.add.Tensor", "aten.mul.Tensor", "aten.sub.Tensor", "aten.div.Tensor")


def made_up_cut(rng: random.Random) -> Cut:
    """A pattern from the vocabulary, not cut from any graph (it may match nowhere)."""
    params = ["p0"]
    nodes: list[PNode] = []
    current = ("ref", "p0")
    for i in range(rng.randint(1, 3)):
        kind = rng.random()
        if kind < 0.35:
            node = PNode(f"n{i}", rng.choice(_UNARY), (current,), ())
        elif kind < 0.8:
            if rng.random() < 0.5:
                other = ("ref", rng.choice([*params, f"p{len(params)}"]))
                if other[1] not in params:
                    params.append(other[1])
            else:
                other = ("lit", repr(rng.choice((2.0, 1e-6, 1, 0.5))))
            node = PNode(f"n{i}", rng.choice(_BINARY), (current, other), ())
        elif kind < 0.9:
            node = PNode(f"n{i}", "aten.mean.dim", (current, ("lit", "[-1]"), ("lit", "True")), ())
        else:
            node = PNode(f"n{i}", "aten.pow.Tensor_Scalar", (current, ("lit", "2")), ())
        nodes.append(node)
        current = ("ref", node.name)
    return Cut(tuple(params), tuple(nodes), tuple(rng.random() < 0.5 for _ in nodes))
