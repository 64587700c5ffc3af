"""Random PyTorch programs over a small op vocabulary, as data that prints as source.

A :class:`Program` is a list of lines ``vK = <template>`` over earlier values, a list of
input shapes and dtypes, and the values it returns. It is built by :func:`random_program`
from a seeded ``random.Random`` (running each op eagerly while it is drawn, so every line is
valid for the shapes and dtypes it meets), turned into an ``nn.Module`` by :meth:`module`
and into source by :meth:`source` (what a repro script prints), and made smaller by
:meth:`shrinks` (the candidates the fuzz driver tries while the disagreement persists).

Vocabulary: add, mul, sub, div (tensor, scalar literal or tensor constant operand), neg,
relu, exp, rsqrt, pow, mean, sum, view/reshape, transpose, cat, select, casts between
float32 and bfloat16; values fan out and several are returned.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import torch

__all__ = ["Op", "Program", "random_program", "export_program"]

SCALARS = (2.0, 0.5, -1.0, 3.0, 1e-6, 1)
POWERS = (2, 0.5, -0.5, 3, 2.0)
SHAPES = ((2, 3, 4), (3, 4), (4,), (2, 1, 4))


@dataclasses.dataclass(frozen=True)
class Op:
    """One line: ``name = template.format(*refs)``."""

    name: str
    template: str
    refs: tuple[str, ...]

    def line(self) -> str:
        return f"{self.name} = {self.template.format(*self.refs)}"


@dataclasses.dataclass(frozen=True)
class Program:
    """Inputs (``x0``...), lines, and the values returned."""

    inputs: tuple[tuple[tuple[int, ...], str], ...]
    ops: tuple[Op, ...]
    outputs: tuple[str, ...]

    def source(self) -> str:
        names = ", ".join(f"x{i}" for i in range(len(self.inputs)))
        body = "".join(f"        {op.line()}\n" for op in self.ops)
        returned = ", ".join(self.outputs)
        return (
            "class Program(torch.nn.Module):\n"
            f"    def forward(self, {names}):\n{body}"
            f"        return ({returned},)\n"
        )

    def module(self) -> torch.nn.Module:
        env: dict[str, Any] = {"torch": torch}
        exec(compile(self.source(), "<fuzz program>", "exec"), env)
        return env["Program"]()

    def example_inputs(self, seed: int = 0) -> tuple[torch.Tensor, ...]:
        g = torch.Generator().manual_seed(seed)
        return tuple(
            torch.randn(shape, generator=g).to(getattr(torch, dtype))
            for shape, dtype in self.inputs
        )

    def live(self) -> Program:
        """Without the lines no returned value needs."""
        need = set(self.outputs)
        kept = []
        for op in reversed(self.ops):
            if op.name in need:
                kept.append(op)
                need.update(op.refs)
        return dataclasses.replace(self, ops=tuple(reversed(kept)))

    def shrinks(self) -> list[Program]:
        """Smaller programs: fewer returned values, a line replaced by one of its operands."""
        out: list[Program] = []
        if len(self.outputs) > 1:
            for i in range(len(self.outputs)):
                rest = self.outputs[:i] + self.outputs[i + 1 :]
                out.append(dataclasses.replace(self, outputs=rest).live())
        for i, op in enumerate(self.ops):
            for ref in dict.fromkeys(op.refs):
                out.append(self._bypass(i, ref))
        return out

    def _bypass(self, i: int, ref: str) -> Program:
        gone = self.ops[i].name

        def sub(r: str) -> str:
            return ref if r == gone else r

        ops = [
            dataclasses.replace(op, refs=tuple(sub(r) for r in op.refs)) for op in self.ops[i + 1 :]
        ]
        outputs = tuple(dict.fromkeys(sub(r) for r in self.outputs))
        return dataclasses.replace(self, ops=self.ops[:i] + tuple(ops), outputs=outputs).live()


def _pick(rng: random.Random, values: dict[str, torch.Tensor], pred=lambda t: True) -> str | None:
    names = [n for n, t in values.items() if pred(t)]
    if not names:
        return None
    # favour recent values, so programs are chains with some fan-out
    return names[-1] if rng.random() < 0.4 else rng.choice(names)


def _draw_op(rng: random.Random, values: dict[str, torch.Tensor]) -> tuple[str, tuple[str, ...]]:
    """A template and its refs, for values drawn from ``values`` (may be invalid: checked)."""
    a = _pick(rng, values)
    ta = values[a]
    kind = rng.choice(
        ["binary"] * 5 + ["unary"] * 3 + ["reduce", "view", "transpose", "cat", "select", "cast"]
    )
    if kind == "binary":
        op = rng.choice(["add", "mul", "sub", "div"])
        symbol = {"add": "+", "mul": "*", "sub": "-", "div": "/"}[op]
        r = rng.random()
        if r < 0.45:
            b = _pick(rng, values, lambda t: _broadcasts(t.shape, ta.shape))
            if b is None:
                return f"{{0}} {symbol} 2.0", (a,)
            return (
                f"torch.{op}({{0}}, {{1}})" if rng.random() < 0.5 else f"{{0}} {symbol} {{1}}"
            ), (
                a,
                b,
            )
        if r < 0.8:
            return f"{{0}} {symbol} {rng.choice(SCALARS)!r}", (a,)
        return f"torch.{op}({{0}}, torch.tensor({rng.choice(SCALARS[:4])!r}))", (a,)
    if kind == "unary":
        u = rng.choice(["neg", "relu", "exp", "rsqrt", "pow", "abs_rsqrt"])
        if u == "pow":
            return f"torch.pow({{0}}, {rng.choice(POWERS)!r})", (a,)
        if u == "abs_rsqrt":
            return "torch.rsqrt({0}.abs() + 1e-6)", (a,)
        return (f"torch.{u}({{0}})" if rng.random() < 0.5 else f"{{0}}.{u}()"), (a,)
    if kind == "reduce" and ta.dim() >= 1:
        r = rng.choice(["mean", "sum"])
        dim = rng.randrange(-ta.dim(), ta.dim())
        return f"{{0}}.{r}({dim}, keepdim={rng.random() < 0.6})", (a,)
    if kind == "view" and ta.dim() >= 1:
        choice = rng.choice(["flat", "last", "unsqueeze"])
        if choice == "flat":
            return "{0}.reshape(-1)", (a,)
        if choice == "last":
            return f"{{0}}.view(-1, {ta.shape[-1]})", (a,)
        return f"{{0}}.reshape(1, *{tuple(ta.shape)!r})", (a,)
    if kind == "transpose" and ta.dim() >= 2:
        return "{0}.transpose(0, -1)", (a,)
    if kind == "cat" and ta.dim() >= 1:
        b = _pick(rng, values, lambda t: t.dim() == ta.dim() and t.shape[1:] == ta.shape[1:])
        return "torch.cat([{0}, {1}])", (a, b or a)
    if kind == "select" and ta.dim() >= 1:
        return f"{{0}}.select(0, {rng.randrange(ta.shape[0])})", (a,)
    if kind == "cast":
        return ("{0}.to(torch.bfloat16)" if ta.dtype == torch.float32 else "{0}.float()"), (a,)
    return "{0} * 2.0", (a,)


def _broadcasts(s: torch.Size, t: torch.Size) -> bool:
    try:
        torch.broadcast_shapes(s, t)
    except RuntimeError:
        return False
    return True


def random_program(rng: random.Random, *, max_ops: int = 8) -> Program:
    """A program of 1 to ``max_ops`` lines over 1-3 inputs."""
    n_in = rng.randint(1, 3)
    base = rng.choice(SHAPES)
    inputs = []
    for _ in range(n_in):
        shape = base if rng.random() < 0.7 else rng.choice(SHAPES)
        dtype = "float32" if rng.random() < 0.75 else "bfloat16"
        inputs.append((tuple(shape), dtype))
    g = torch.Generator().manual_seed(rng.randrange(2**31))
    values = {
        f"x{i}": torch.randn(s, generator=g).to(getattr(torch, d))
        for i, (s, d) in enumerate(inputs)
    }
    ops: list[Op] = []
    for k in range(rng.randint(1, max_ops)):
        for _ in range(10):
            template, refs = _draw_op(rng, values)
            env = {"torch": torch, **{f"_{i}": values[r] for i, r in enumerate(refs)}}
            expr = template.format(*(f"_{i}" for i in range(len(refs))))
            try:
                value = eval(expr, env)
            except (RuntimeError, IndexError, TypeError):
                continue
            if value.numel() == 0:
                continue
            name = f"v{k + n_in}"
            values[name] = value
            ops.append(Op(name, template, refs))
            break
    computed = [op.name for op in ops] or ["x0"]
    outputs = [computed[-1]]
    for name in computed[:-1]:
        if rng.random() < 0.25:
            outputs.append(name)
    if not ops:
        ops.append(Op(f"v{n_in}", "{0} + 1.0", ("x0",)))
        outputs = [f"v{n_in}"]
    return Program(tuple(inputs), tuple(ops), tuple(outputs)).live()


def export_program(program: Program) -> torch.export.ExportedProgram:
    """``torch.export`` of the program, decomposed to core ATen."""
    return torch.export.export(program.module(), program.example_inputs()).run_decompositions()
