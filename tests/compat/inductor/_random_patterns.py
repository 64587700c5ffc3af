"""Random programs and patterns for differential tests of Inductor's pattern matcher.

:func:`random_case` draws, from a ``random.Random`` (deterministically), a small tensor
program over ``add/mul/sub/relu/neg/sum/cat/view`` (values read more than once, several
outputs, some computations repeated so a pattern may match at several sites) and a
``register_replacement`` pair for it: a search function cut out of the program (so it
matches somewhere, unless an intermediate it covers is also read outside it) or made up over
the program's shapes, and a replacement. Every function is generated as Python source
(``Case.source``), so a disagreement can be written out as a standalone repro::

    import random
    from _random_patterns import random_case

    case = random_case(random.Random(7))
    program, inputs, search, replacement = case  # a Case unpacks as this 4-tuple
    register_replacement(search, replacement, case.search_inputs, fwd_only, pass_)
    print(case.source)

``inputs`` are the program's inputs; ``case.search_inputs`` the example inputs for
``register_replacement``, each shaped as the program value its search parameter stands for.
``Case.equivalent`` says whether the replacement computes what the search function does
(then a rewritten program must still compute the original's outputs; otherwise it adds 1 to
each result, or returns the first input for each); ``Case.kind`` how the pattern was made:
``"cut"``; ``"cut+output"`` (an intermediate read outside the cut made an output too);
``"cut+input"`` (an input returned as well); ``"cut+unanchored"`` (an output sharing nothing
with the others added); ``"made_up"``. :mod:`_differential` runs a case through Inductor and
fxpass and gives the verdict.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["Case", "Stmt", "random_case", "random_program"]

Shape = tuple[int, ...]


@dataclass
class Stmt:
    """One value of a program: ``name = expr`` (``{0}``, ``{1}``... are ``args``)."""

    name: str
    op: str
    template: str
    args: list[str]
    shape: Shape
    users: list[str] = field(default_factory=list)

    def text(self, rename: dict[str, str] | None = None) -> str:
        rename = rename or {}
        return self.template.format(*(rename.get(a, a) for a in self.args))


@dataclass
class Case:
    """A program, its inputs, and a search/replacement pair (see the module docstring);
    unpacks as ``(program, inputs, search, replacement)``. ``search_inputs``: example inputs
    for ``register_replacement``, shaped as the program values the search parameters stand
    for."""

    program: Callable[..., Any]
    inputs: list[torch.Tensor]
    search: Callable[..., Any]
    replacement: Callable[..., Any]
    source: str
    equivalent: bool
    kind: str
    search_inputs: list[torch.Tensor]

    def __iter__(self) -> Iterator[Any]:
        return iter((self.program, self.inputs, self.search, self.replacement))


SCALARS = (1.0, 2.0, 0.5, -1.0)
_UNARY = ("relu", "neg")
_BINARY = ("add", "mul", "sub")


def _new_stmt(rng: random.Random, name: str, values: list[tuple[str, Shape]]) -> Stmt:
    """A random statement reading earlier ``values`` (recent ones more often)."""

    def pick(shape: Shape | None = None) -> tuple[str, Shape] | None:
        pool = [v for v in values if shape is None or v[1] == shape]
        if not pool:
            return None
        i = min(len(pool) - 1, int(rng.expovariate(0.6)))
        return pool[-1 - i]

    a, shape = pick()
    op = rng.choice(("add", "mul", "sub", "add", "mul", "relu", "neg", "sum", "cat", "view"))
    if op in _UNARY:
        tpl = "torch.relu({0})" if op == "relu" else "torch.neg({0})"
        return Stmt(name, op, tpl, [a], shape)
    if op in _BINARY:
        sym = {"add": "+", "mul": "*", "sub": "-"}[op]
        b = pick(shape) if rng.random() < 0.7 else None
        if b is None:
            return Stmt(name, op, f"{{0}} {sym} {rng.choice(SCALARS)!r}", [a], shape)
        return Stmt(name, op, f"{{0}} {sym} {{1}}", [a, b[0]], shape)
    if op == "sum":
        if not shape or rng.random() < 0.3:
            return Stmt(name, op, "{0}.sum()", [a], ())
        return Stmt(name, op, "{0}.sum(-1, keepdim=True)", [a], (*shape[:-1], 1))
    if op == "cat" and shape:
        b = pick(shape) or (a, shape)
        return Stmt(name, op, "torch.cat([{0}, {1}])", [a, b[0]], (2 * shape[0], *shape[1:]))
    numel = 1
    for s in shape:
        numel *= s
    if len(shape) == 1 and numel % 2 == 0:
        return Stmt(name, "view", f"{{0}}.view(2, {numel // 2})", [a], (2, numel // 2))
    return Stmt(name, "view", "{0}.view(-1)", [a], (numel,))


def _again(rng: random.Random, name: str, old: Stmt, values: list) -> Stmt | None:
    """``old``'s operation on other values of the same shapes (None if there are none)."""
    shapes = dict(values)
    args = []
    for a in old.args:
        pool = [v for v, shape in values if shape == shapes[a]]
        args.append(rng.choice(pool))
    return Stmt(name, old.op, old.template, args, old.shape)


def random_program(
    rng: random.Random, n_inputs: int = 2, n_stmts: int = 6, shape: Shape | None = None
):
    """(parameter names, their shapes, statements, output names) of a random program whose
    inputs have ``shape`` (drawn if None)."""
    shape = shape or (rng.choice((2, 3)), rng.choice((2, 4)))
    params = [f"a{i}" for i in range(n_inputs)]
    values: list[tuple[str, Shape]] = [(p, shape) for p in params]
    stmts: list[Stmt] = []
    for i in range(n_stmts):
        s = _new_stmt(rng, f"v{i}", values)
        if stmts and rng.random() < 0.25:  # an earlier computation again on other values
            s = _again(rng, f"v{i}", rng.choice(stmts), values) or s
        stmts.append(s)
        values.append((s.name, s.shape))
    by_name = {s.name: s for s in stmts}
    for s in stmts:
        for a in s.args:
            if a in by_name and s.name not in by_name[a].users:
                by_name[a].users.append(s.name)
    outs = [stmts[-1].name]
    for s in stmts[:-1]:
        if rng.random() < 0.25:
            outs.append(s.name)  # returned as well as (maybe) read; others may stay dead
    return params, [shape] * n_inputs, stmts, outs


def _function(name: str, params: list[str], stmts: list[Stmt], outs: list[str], rename=None):
    rename = dict(rename or {})
    body = [f"    {rename.get(s.name, s.name)} = {s.text(rename)}" for s in stmts]
    ret = ", ".join(rename.get(o, o) for o in outs)
    if len(outs) == 1:
        ret = rename.get(outs[0], outs[0])
    return "\n".join([f"def {name}({', '.join(params)}):", *body, f"    return {ret}"])


_SPELLINGS: dict[str, list[str]] = {
    "torch.relu({0})": ["torch.clamp_min({0}, 0.0)"],
    "torch.neg({0})": ["{0} * -1.0", "0.0 - {0}"],
    "{0} + {1}": ["{1} + {0}", "{0} - torch.neg({1})"],
    "{0} * {1}": ["{1} * {0}"],
    "{0} - {1}": ["{0} + torch.neg({1})"],
    "{0}.sum(-1, keepdim=True)": ["torch.sum({0}, [-1], keepdim=True)"],
    "torch.cat([{0}, {1}])": ["torch.cat([{0}, {1}], 0)"],
}


def _respell(rng: random.Random, s: Stmt) -> Stmt:
    """``s`` with the same value, maybe spelled otherwise."""
    options = _SPELLINGS.get(s.template)
    if options and rng.random() < 0.7:
        return Stmt(s.name, s.op, rng.choice(options), s.args, s.shape)
    return s


def _cut(rng: random.Random, stmts: list[Stmt], outs: list[str]):
    """A connected piece of the program: (inputs, statements, outputs, kind)."""
    by_name = {s.name: s for s in stmts}
    roots = [s for s in stmts if s.op != "view" or rng.random() < 0.3]
    root = rng.choice(roots or stmts)
    chosen = {root.name}
    frontier = [root]
    for _ in range(rng.randint(0, 3)):
        grow = [a for s in frontier for a in s.args if a in by_name and a not in chosen]
        if not grow:
            break
        a = rng.choice(grow)
        chosen.add(a)
        frontier.append(by_name[a])
    piece = [s for s in stmts if s.name in chosen]
    inputs: list[str] = []
    for s in piece:
        for a in s.args:
            if a not in chosen and a not in inputs:
                inputs.append(a)
    results = [root.name]
    kind = "cut"
    escaping = [
        s.name
        for s in piece
        if s is not root and (s.name in outs or any(u not in chosen for u in s.users))
    ]
    if escaping and rng.random() < 0.6:
        results += escaping
        kind = "cut+output"
    return inputs, piece, results, kind


def random_case(rng: random.Random) -> Case:
    """A random program and a random ``register_replacement`` pair for it (the module
    docstring says what is drawn); deterministic in ``rng``."""
    params, shapes, stmts, outs = random_program(rng, rng.randint(1, 3), rng.randint(2, 7))
    shape_of = dict(zip(params, shapes)) | {s.name: s.shape for s in stmts}
    program_src = _function("program", params, stmts, outs)
    if rng.random() < 0.75:
        inputs, piece, results, kind = _cut(rng, stmts, outs)
    else:  # made up over the program's first shape: may match nowhere, or somewhere
        n = rng.randint(1, 2)
        sub_params, _, piece, _ = random_program(rng, n, rng.randint(1, 2), shapes[0])
        for p in sub_params:
            shape_of[f"m_{p}"] = shapes[0]
        renamed = {p: f"m_{p}" for p in sub_params} | {s.name: f"m_{s.name}" for s in piece}
        piece = [
            Stmt(renamed[s.name], s.op, s.template, [renamed[a] for a in s.args], s.shape)
            for s in piece
        ]
        shape_of |= {s.name: s.shape for s in piece}
        results, kind = [piece[-1].name], "made_up"
        if rng.random() < 0.9:  # only what the result reads (else: unused inputs, dead code)
            live = {piece[-1].name}
            for s in reversed(piece):
                if s.name in live:
                    live.update(s.args)
            piece = [s for s in piece if s.name in live]
            sub_params = [p for p in sub_params if renamed[p] in live]
        inputs = [renamed[p] for p in sub_params]
    if kind != "made_up" and rng.random() < 0.1:  # an input returned as well
        results = [*results, inputs[0]]
        kind = "cut+input"
    elif kind != "made_up" and rng.random() < 0.15:  # an output sharing nothing with the rest
        extra = Stmt(f"x{len(inputs)}_out", "sum", "{0}.sum()", [f"x{len(inputs)}"], ())
        shape_of[extra.args[0]] = shape_of[params[0]]
        inputs = [*inputs, extra.args[0]]
        piece = [*piece, extra]
        results = [*results, extra.name]
        kind = "cut+unanchored"
    names = {v: f"x{i}" for i, v in enumerate(inputs)}
    names |= {s.name: f"t{i}" for i, s in enumerate(piece)}
    search_src = _function("search", list(names.values())[: len(inputs)], piece, results, names)
    equivalent = rng.random() < 0.8
    if equivalent:
        spelled = [_respell(rng, s) for s in piece]
        repl_src = _function(
            "replacement", list(names.values())[: len(inputs)], spelled, results, names
        )
    elif rng.random() < 0.3 and all(shape_of.get(r) == shape_of[inputs[0]] for r in results):
        # an input for every output: the whole match is dead once replaced
        params_ = list(names.values())[: len(inputs)]
        repl_src = "\n".join(
            [
                f"def replacement({', '.join(params_)}):",
                f"    return {', '.join([params_[0]] * len(results))}",
            ]
        )
    else:  # computes something else: both matchers must still agree on what they leave
        bumped = [*piece, *(Stmt(f"{r}_b", "add", "{0} + 1.0", [r], ()) for r in results)]
        repl_src = _function(
            "replacement",
            list(names.values())[: len(inputs)],
            bumped,
            [f"{r}_b" for r in results],
            names | {f"{r}_b": f"{names[r]}_b" for r in results},
        )
    source = "\n\n".join(["import torch", program_src, search_src, repl_src]) + "\n"
    env: dict[str, Any] = {}
    exec(compile(source, f"<random case {kind}>", "exec"), env)
    gen = torch.Generator().manual_seed(rng.randrange(2**31))
    prog_inputs = [torch.randn(shape_of[p], generator=gen) for p in params]
    search_inputs = [torch.randn(shape_of[v], generator=gen) for v in inputs]
    return Case(
        env["program"],
        prog_inputs,
        env["search"],
        env["replacement"],
        source,
        equivalent,
        kind,
        search_inputs,
    )
