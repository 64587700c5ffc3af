"""Random small FX programs and patterns cut out of them, for differential tests and fuzzers.

The API (``tests/compat/test_subgraph_differential.py`` and ``tools/fuzz.py`` use it):

* :class:`Chooser` — every generator takes one: ``Chooser(random.Random(seed))`` for a
  fuzzer, ``Chooser.of(draw)`` inside a ``@st.composite`` hypothesis strategy (shrinkable).
  It offers ``integer(lo, hi)``, ``choice(seq)``, ``coin(p)``.
* :func:`random_program(ch, n_inputs=, n_steps=) <random_program>` -> ``GraphModule``: a
  program over float tensors of shape ``SHAPE`` built from :data:`OPS` (``add``, ``mul``,
  ``sub`` with a node or a literal scalar, ``relu``, ``neg``, ``cat``, ``select``, ``getitem``
  of a ``chunk`` or of a tensor), in several spellings (methods, ``alpha=``, ``dim=`` by
  position or keyword, lists or tuples), with repeated inputs (``x + x``) and fan-out; dead
  code removed. Node
  names say the op (``add_1``, ``select``), so node-name filters have something to read.
* :func:`program_inputs(gm, seed) <program_inputs>` -> tuple of tensors for its placeholders.
* :func:`cut_pattern(ch, gm) <cut_pattern>` -> ``GraphModule`` or None: a connected piece
  of ``gm`` (one or two roots, grown towards the inputs) as a pattern graph, its inputs as
  placeholders (sometimes a literal scalar too), returning the roots and maybe an inner node.
* :func:`made_up_pattern(ch) <made_up_pattern>` -> ``GraphModule``: a small program of its
  own, returning its last value (patterns that may match nothing).
* :func:`replacement_for(ch, pattern) <replacement_for>` -> ``GraphModule`` with the
  pattern's placeholders and outputs: the pattern with binary ops swapped among
  add/sub/mul and unary ones between relu/neg, sometimes a ``neg`` on an output — shapes
  kept, so rewritten programs still run.
* :func:`programs`, :func:`patterns_for`: the same as hypothesis strategies.
"""

from __future__ import annotations

import operator
import random
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx

__all__ = [
    "OPS",
    "SHAPE",
    "Chooser",
    "cut_pattern",
    "made_up_pattern",
    "program_inputs",
    "patterns_for",
    "programs",
    "random_program",
    "replacement_for",
]

SHAPE = (4, 3)
BINARY = (torch.add, torch.mul, torch.sub)
UNARY = (torch.relu, torch.neg)
OPS = ("add", "mul", "sub", "relu", "neg", "cat", "select", "getitem")
LITERALS = (1, 2, 0.5, 2.0, -1.0)


class Chooser:
    """Random choices from a ``random.Random`` or a hypothesis ``draw``."""

    def __init__(self, rnd: random.Random | None = None, draw: Callable | None = None) -> None:
        self.rnd, self.draw = rnd, draw

    @classmethod
    def of(cls, draw: Callable) -> Chooser:
        return cls(draw=draw)

    def integer(self, lo: int, hi: int) -> int:
        """An integer in [lo, hi]."""
        if self.draw is not None:
            from hypothesis import strategies as st

            return self.draw(st.integers(lo, hi))
        assert self.rnd is not None
        return self.rnd.randint(lo, hi)

    def choice(self, seq: Sequence[Any]) -> Any:
        return seq[self.integer(0, len(seq) - 1)]

    def coin(self, p: float = 0.5) -> bool:
        return self.integer(0, 99) < int(p * 100)


# ----- programs ---------------------------------------------------------------------------
def random_program(ch: Chooser, n_inputs: int | None = None, n_steps: int | None = None):
    """A random program (see the module docstring) as a GraphModule."""
    n_inputs = n_inputs if n_inputs is not None else ch.integer(1, 3)
    n_steps = n_steps if n_steps is not None else ch.integer(2, 10)
    g = fx.Graph()
    vals: list[tuple[fx.Node, tuple[int, ...]]] = []
    for i in range(n_inputs):
        vals.append((g.placeholder(f"x{i}"), SHAPE))
    for _ in range(n_steps):
        _step(ch, g, vals)
    outs = [vals[-1][0]]
    if ch.coin(0.3) and len(vals) > n_inputs + 1:
        other = ch.choice(vals[n_inputs:-1])[0]
        if other is not outs[0]:
            outs.append(other)
    g.output(outs[0] if len(outs) == 1 else tuple(outs))
    g.eliminate_dead_code()
    gm = fx.GraphModule(torch.nn.Module(), g)
    return gm


def _pick(ch: Chooser, vals: list, shape: tuple[int, ...] | None = None):
    pool = [v for v in vals if shape is None or v[1] == shape]
    # recent values more often: chains, not only wide fans
    if len(pool) > 2 and ch.coin(0.5):
        pool = pool[-2:]
    return ch.choice(pool)


def _step(ch: Chooser, g: fx.Graph, vals: list) -> None:
    op = ch.choice(OPS)
    a, shape = _pick(ch, vals)
    if op in ("add", "mul", "sub"):
        fn = BINARY[("add", "mul", "sub").index(op)]
        if ch.coin(0.3):
            b: Any = ch.choice(LITERALS)
        else:
            b = _pick(ch, vals, shape)[0]
        args = (a, b) if ch.coin(0.8) or not isinstance(b, fx.Node) else (b, a)
        kwargs = {"alpha": 2} if op != "mul" and ch.coin(0.1) else {}
        vals.append((g.call_function(fn, args, kwargs), shape))
    elif op in ("relu", "neg"):
        if ch.coin(0.2):  # the method spelling: x.relu()
            vals.append((g.call_method(op, (a,)), shape))
        else:
            vals.append((g.call_function(UNARY[("relu", "neg").index(op)], (a,)), shape))
    elif op == "cat":
        parts = [a, _pick(ch, vals, shape)[0]]
        if ch.coin(0.3):
            parts.append(_pick(ch, vals, shape)[0])
        new = (shape[0] * len(parts), *shape[1:])
        spelled = ch.integer(0, 3)  # cat([a, b]), cat((a, b)), cat([a, b], 0), dim=0
        seq: Any = tuple(parts) if spelled == 1 else parts
        args, kwargs = (
            ((seq, 0), {}) if spelled == 2 else ((seq,), {"dim": 0} if spelled == 3 else {})
        )
        vals.append((g.call_function(torch.cat, args, kwargs), new))
    elif op == "select":
        if len(shape) < 2:
            vals.append((g.call_function(torch.neg, (a,)), shape))
            return
        i = ch.integer(0, shape[0] - 1)
        spelled = ch.integer(0, 2)  # torch.select(a, 0, i), a.select(0, i), a[i]
        if spelled == 0:
            node = g.call_function(torch.select, (a, 0, i))
        elif spelled == 1:
            node = g.call_method("select", (a, 0, i))
        else:
            node = g.call_function(operator.getitem, (a, i))
        vals.append((node, shape[1:]))
    else:  # getitem of a chunk: a tuple-valued node and its readers
        if shape[0] % 2:
            vals.append((g.call_function(torch.relu, (a,)), shape))
            return
        chunks = g.call_function(torch.chunk, (a, 2))
        half = (shape[0] // 2, *shape[1:])
        vals.append((g.call_function(operator.getitem, (chunks, ch.integer(0, 1))), half))


def program_inputs(gm: fx.GraphModule, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Inputs for ``gm``'s placeholders (shape ``SHAPE``), reproducible from ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    n = len(gm.graph.find_nodes(op="placeholder"))
    return tuple(torch.randn(SHAPE, generator=gen) for _ in range(n))


# ----- patterns ---------------------------------------------------------------------------
def _computes(n: fx.Node) -> bool:
    return n.op in ("call_function", "call_method")


def cut_pattern(ch: Chooser, gm: fx.GraphModule) -> fx.GraphModule | None:
    """A connected piece of ``gm`` as a pattern (see the module docstring), or None when
    ``gm`` computes nothing."""
    nodes = [n for n in gm.graph.nodes if _computes(n)]
    if not nodes:
        return None
    roots = [ch.choice(nodes)]
    if ch.coin(0.2) and len(nodes) > 1:
        other = ch.choice(nodes)
        if other is not roots[0]:
            roots.append(other)
    inside: dict[fx.Node, None] = {}
    frontier = list(roots)
    budget = ch.integer(0, 4)
    while frontier:
        n = frontier.pop(0)
        if n in inside:
            continue
        inside[n] = None
        for a in n.all_input_nodes:
            if _computes(a) and a not in inside and budget > 0 and ch.coin(0.6):
                budget -= 1
                frontier.append(a)
    order = [n for n in gm.graph.nodes if n in inside]
    outs = list(dict.fromkeys(roots))
    inner = [n for n in order if n not in outs]
    if inner and ch.coin(0.2):
        outs.append(ch.choice(inner))
    return _as_pattern(ch, order, outs)


def _as_pattern(ch: Chooser, order: list[fx.Node], outs: list[fx.Node]) -> fx.GraphModule:
    g = fx.Graph()
    inside = set(order)
    outer: dict[fx.Node, fx.Node] = {}  # a value from outside the piece -> its placeholder
    count = [0]

    def placeholder() -> fx.Node:
        count[0] += 1
        return g.placeholder(f"p{count[0] - 1}")

    def lift(a: Any, literal_ok: bool) -> Any:
        if isinstance(a, fx.Node):
            if a not in inside and a not in outer:
                outer[a] = placeholder()
            return a
        if isinstance(a, (list, tuple)):
            return type(a)(lift(x, False) for x in a)
        if literal_ok and isinstance(a, (int, float)) and ch.coin(0.2):
            return placeholder()  # a placeholder standing for a literal
        return a

    # placeholders first, in order of first use (as symbolic_trace makes them), then the ops
    staged = [(n, tuple(lift(a, n.target in BINARY) for a in n.args)) for n in order]
    env: dict[fx.Node, fx.Node] = {}
    for n, args in staged:
        mapped = fx.node.map_arg(args, lambda a: env[a] if a in env else outer.get(a, a))
        env[n] = g.create_node(n.op, n.target, mapped, dict(n.kwargs))
    result = [env[o] for o in outs]
    g.output(result[0] if len(result) == 1 else tuple(result))
    return fx.GraphModule(torch.nn.Module(), g)


def made_up_pattern(ch: Chooser) -> fx.GraphModule:
    """A small program of its own (one or two placeholders, one to three ops)."""
    gm = random_program(ch, n_inputs=ch.integer(1, 2), n_steps=ch.integer(1, 3))
    g = gm.graph
    out = g.output_node()
    if isinstance(out.args[0], tuple):  # one output: the last value
        out.args = (out.args[0][0],)
    g.eliminate_dead_code()
    for p in list(g.find_nodes(op="placeholder")):
        if not p.users:
            g.erase_node(p)
    gm.recompile()
    return gm


def replacement_for(ch: Chooser, pattern: fx.GraphModule) -> fx.GraphModule:
    """A replacement with ``pattern``'s placeholders and outputs (see the module docstring)."""
    g = fx.Graph()
    env: dict[fx.Node, Any] = {}
    for n in pattern.graph.nodes:
        if n.op == "placeholder":
            env[n] = g.placeholder(n.name)
        elif n.op == "output":

            def out(v: Any) -> Any:
                if isinstance(v, fx.Node) and v.target is not torch.chunk and ch.coin(0.3):
                    return g.call_function(torch.neg, (v,))
                return v

            res = fx.node.map_arg(n.args[0], lambda a: env[a])
            res = tuple(out(v) for v in res) if isinstance(res, tuple) else out(res)
            g.output(res)
        else:
            target = n.target
            if target in BINARY:  # mul takes no alpha=
                target = ch.choice(BINARY[::2] if "alpha" in n.kwargs else BINARY)
            elif target in UNARY:
                target = ch.choice(UNARY)
            args = fx.node.map_arg(n.args, lambda a: env[a])
            env[n] = g.create_node(n.op, target, args, dict(n.kwargs))
    return fx.GraphModule(torch.nn.Module(), g)


# ----- hypothesis strategies --------------------------------------------------------------
def programs():
    """A hypothesis strategy of random programs."""
    from hypothesis import strategies as st

    return st.composite(lambda draw: random_program(Chooser.of(draw)))()


def patterns_for(gm: fx.GraphModule):
    """A hypothesis strategy of patterns for ``gm``: cut out of it, or made up."""
    from hypothesis import strategies as st

    def make(draw):
        ch = Chooser.of(draw)
        if ch.coin(0.7):
            cut = cut_pattern(ch, gm)
            if cut is not None:
                return cut
        return made_up_pattern(ch)

    return st.composite(make)()
