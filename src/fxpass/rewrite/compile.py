"""Compiled matchers: a rule's pattern turned into straight-line Python, once.

The pattern interpreter (:mod:`fxpass.rewrite.interpreted`) matches by continuation-passing,
which supports every feature — alternatives with backtracking, explanations, torch's
matching rules — at the price of a closure per step. Most rules have no alternatives:
their only choice points are commutative operands. For those, :func:`compile_rule`
generates one function that walks the pattern depth-first with the bindings in local
variables, a ``for`` loop over the two operand orders at each commutative op, and
``continue`` as backtracking; it is several times faster and gives the same matches. A
rule whose pattern has alternatives gets the interpreter's handlers specialized to its
pattern nodes (:mod:`~fxpass.rewrite.specialize`); a multi-root pattern keeps the
interpreter (as do the explaining and the torch-compatible matchers). Both order sibling sub-patterns by
:func:`~fxpass.rewrite.arguments.rank` (ties in the order of the op's arguments), so they
find the same match first.

>>> print(compile_rule(rule).source)     # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch.fx import Node

from ..fxutil.dialect import has_dim_order_spelling, is_edge_op
from ..fxutil.fx_internals import ARGS_ATTR, KWARGS_ATTR
from ._state import MISSING
from .arguments import rank
from .constraint import constant_number, lit_eq
from .interpreted import is_a, strict_ok
from .leaves import AnyOf, Const, Lit, Pattern, Scalar, Seq, Through, Var
from .pattern import P

__all__ = ["CompiledMatcher", "MatchPath", "compile_path", "compile_rule"]

_MAX_LINES = 4000


class CompiledMatcher:
    """A generated matching function (``fn(node, st, final) -> bool``, ``final(rule, st)``
    the whole-match checks) and its source."""

    def __init__(self, fn: Callable[..., bool], source: str) -> None:
        self.fn = fn
        self.source = source


def _supported(p: Pattern) -> bool:
    for q in p.walk():
        if isinstance(q, AnyOf):
            return False
        if not isinstance(q, (P, Var, Const, Lit, Seq)):
            return False
    return True


def compile_rule(rule: Any) -> CompiledMatcher | None:
    """The compiled matcher for ``rule``, or None when it needs the interpreter."""
    if len(rule.roots) != 1 or not _supported(rule.roots[0]):
        return None
    return _generate(rule, None)


class MatchPath:
    """The choices one match made through a pattern with alternatives (see
    :mod:`~fxpass.rewrite.learned`), by ``id`` of the pattern node that made them:

    * ``options``: per :class:`~fxpass.rewrite.AnyOf`, (the option taken, what the value it
      was taken at must be where it is not the first option, else None: the target of a
      call_function node, ``("op", kind)`` for a node of another kind, or
      :data:`NOT_A_NODE`);
    * ``chains``: per :meth:`P.through <fxpass.rewrite.P.through>`, the targets of the nodes
      it saw through, outermost first (empty: none);
    * ``targets``: per op pattern, the target of the node it matched.
    """

    __slots__ = ("chains", "options", "targets")

    def __init__(
        self, options: dict[int, tuple[int, Any]], chains: dict[int, tuple], targets: dict[int, Any]
    ) -> None:
        self.options, self.chains, self.targets = options, chains, targets

    def key(self) -> tuple:
        """Equal for equal paths (the targets by identity)."""
        return (
            tuple(sorted((k, i, id(g)) for k, (i, g) in self.options.items())),
            tuple(sorted((k, tuple(map(id, ts))) for k, ts in self.chains.items())),
            tuple(sorted((k, id(t)) for k, t in self.targets.items())),
        )


#: A :class:`MatchPath` option taken at a value that is no node.
NOT_A_NODE: Any = type("NOT_A_NODE", (), {"__repr__": lambda self: "<not a node>"})()

_PATH_CLASSES = (P, Var, Const, Lit, Seq, AnyOf, Through, Scalar)


def compile_path(rule: Any, path: MatchPath) -> CompiledMatcher | None:
    """``rule``'s matcher along ``path`` alone: straight-line code that takes the recorded
    option at each alternative, sees through as many views as recorded, expects each op
    pattern's recorded target and tries no other operand order. Its function returns True
    (matched, ``final`` accepted), None (the structure matched, ``final`` did not) or False.
    None where the rule has more roots or pattern classes of other matchers."""
    if len(rule.roots) != 1:
        return None
    if any(q.__class__ not in _PATH_CLASSES for q in rule.roots[0].walk()):
        return None
    try:
        return _generate(rule, path)
    except KeyError:  # a choice the path does not hold: it was not made by this rule
        return None


def _generate(rule: Any, path: MatchPath | None) -> CompiledMatcher | None:
    gen = _Gen()
    gen.path = path
    gen.rule = gen.const(rule)
    gen.emit([(rule.roots[0], "v0")], _Static(), 1)
    if gen.too_big:
        return None
    body = "\n".join(gen.lines)
    source = f"def match(v0, st, final):\n{body}\n    return False\n"
    env = dict(gen.consts)
    env.update(Node=Node, _lit_eq=lit_eq, _strict_ok=strict_ok, MISSING=MISSING)
    env.update(_edge_wrapped=_edge_wrapped, _constant_number=constant_number, _is_a=is_a)
    code = compile(source, f"<fxpass rule {rule.name}>", "exec")
    exec(code, env)
    return CompiledMatcher(env["match"], source)


def _edge_wrapped(target: Any) -> Any:
    """The ATen op an Edge op wraps (same schema); None for anything else."""
    return target._op if is_edge_op(target) and hasattr(target, "_op") else None


class _Static:
    """What is known at a point of the generated code: bound names, DAG nodes, nodes."""

    def __init__(self) -> None:
        self.bound: dict[str, str] = {}  # name -> local holding its value
        self.memo: dict[int, str] = {}  # id(shared pattern) -> local holding its node
        self.nodes: list[str] = []  # locals of matched op-pattern nodes, in order
        self.chains: list[str] = []  # locals of the runs of nodes seen through, in order
        self.depth = 0  # open loops: failing is `continue` inside one


class _Gen:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.consts: dict[str, Any] = {}
        self.count = 0
        self.too_big = False
        self.rule = ""
        self.path: MatchPath | None = None  # along one path only (compile_path)

    def const(self, obj: Any) -> str:
        name = f"K{len(self.consts)}"
        self.consts[name] = obj
        return name

    def local(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def line(self, indent: int, text: str) -> None:
        self.lines.append("    " * indent + text)
        if len(self.lines) > _MAX_LINES:
            self.too_big = True

    @staticmethod
    def fail(s: _Static) -> str:
        return "continue" if s.depth else "return False"

    # ----- one pattern at a time, depth first -------------------------------------------
    def emit(self, pending: list[tuple[Pattern, str]], s: _Static, ind: int) -> None:
        while pending and not self.too_big:
            item, pending = pending[0], pending[1:]
            if item[0] == "swap":  # a commutative op whose operands only bind: loop late
                _, c0, c1, e0, e1 = item
                l0, l1 = self.local("x"), self.local("x")
                self.line(ind, f"for {l0}, {l1} in (({e0}, {e1}), ({e1}, {e0})):")
                ind += 1
                s.depth += 1
                pending = [(c0, l0), (c1, l1), *pending]
                continue
            p, v = item
            if isinstance(p, Lit):
                k = self.const(p.value)
                self.line(ind, f"if not ({v} is {k} or _lit_eq({k}, {v})): {self.fail(s)}")
            elif isinstance(p, Var):
                self.var(p, v, s, ind)
            elif isinstance(p, Const):
                self.const_pattern(p, v, s, ind)
            elif p.__class__ is AnyOf:  # along a path only
                pending = self.chosen(p, v, s, ind) + pending
            elif p.__class__ is Through:
                pending = self.seen_through(p, v, s, ind) + pending
            elif p.__class__ is Scalar:
                self.scalar(p, v, s, ind)
            elif isinstance(p, Seq):
                n = len(p.items)
                self.line(
                    ind, f"if not isinstance({v}, (list, tuple)) or len({v}) != {n}: {self.fail(s)}"
                )
                items = []
                for i, item in enumerate(p.items):
                    loc = self.local("q")
                    self.line(ind, f"{loc} = {v}[{i}]")
                    items.append((item, loc))
                pending = items + pending
            else:
                ind, children, deferred = self.op(p, v, s, ind)
                if children is None:  # a later use of a shared node: checked, not re-matched
                    continue
                pending = children + pending + deferred
        if not pending and not self.too_big:
            self.success(s, ind)

    def bind(self, p: Pattern, v: str, s: _Static, ind: int, node: bool) -> bool:
        """Bind name/DAG node; False if ``p`` was matched before (identity checked)."""
        key = id(p)
        if p._shared and key in s.memo:
            m = s.memo[key]
            same = (
                f"{v} is {m}"
                if node
                else f"{v} is {m} or ({v}.__class__ is not Node and _lit_eq({m}, {v}))"
            )
            self.line(ind, f"if not ({same}): {self.fail(s)}")
            return False
        if p._shared:
            s.memo[key] = v
        name = p.name
        if name is not None:
            if name in s.bound:
                b = s.bound[name]
                same = (
                    f"{v} is {b}"
                    if node
                    else f"{v} is {b} or ({v}.__class__ is not Node and _lit_eq({b}, {v}))"
                )
                self.line(ind, f"if not ({same}): {self.fail(s)}")
            else:
                s.bound[name] = v
        return True

    def var(self, p: Var, v: str, s: _Static, ind: int) -> None:
        if p.free and not p._shared:
            return
        if p.node_only:
            self.line(ind, f"if not isinstance({v}, Node): {self.fail(s)}")
        if p.constraint is not None:
            c = self.const(p.constraint)
            self.line(ind, f"if {c}.failure({v}) is not None: {self.fail(s)}")
        self.bind(p, v, s, ind, node=False)

    def const_pattern(self, p: Const, v: str, s: _Static, ind: int) -> None:
        self.line(ind, f"if isinstance({v}, Node): {self.fail(s)}")
        if p.types is not None:
            t = self.const(p.types)
            exclude = bool not in p.types and int in p.types
            cond = f"not isinstance({v}, {t})" + (f" or {v}.__class__ is bool" if exclude else "")
            self.line(ind, f"if {cond}: {self.fail(s)}")
        if p.where is not None:
            w = self.const(p.where)
            self.line(ind, f"if not {w}({v}): {self.fail(s)}")
        self.bind(p, v, s, ind, node=False)

    # ----- along a path (compile_path) -----------------------------------------------------
    def chosen(self, p: AnyOf, v: str, s: _Static, ind: int) -> list[tuple[Pattern, str]]:
        """The option the path took; where it is not the first, the value must be a node
        calling the op it was taken at (the earlier options cannot start at that op)."""
        if p._shared and id(p) in s.memo:
            self.bind(p, v, s, ind, node=False)  # a later use: the same value
            return []
        assert self.path is not None
        index, at = self.path.options[id(p)]
        if at is NOT_A_NODE:
            self.line(ind, f"if {v}.__class__ is Node: {self.fail(s)}")
        elif isinstance(at, tuple):  # ("op", "placeholder"): a node of that kind
            self.line(ind, f"if {v}.__class__ is not Node or {v}.op != {at[1]!r}: {self.fail(s)}")
        elif at is not None:
            k = self.const(at)
            self.line(ind, f"if {v}.__class__ is not Node or {v}.target is not {k}: {self.fail(s)}")
        self.bind(p, v, s, ind, node=False)
        return [(p.options[index], v)]

    def seen_through(self, p: Through, v: str, s: _Static, ind: int) -> list[tuple[Pattern, str]]:
        """The recorded run of views (each calling the recorded op, each a step
        :meth:`Through.step` takes), then the inner pattern behind it."""
        if p._shared and id(p) in s.memo:
            self.bind(p, v, s, ind, node=False)
            return []
        assert self.path is not None
        targets = self.path.chains[id(p)]
        self.bind(p, v, s, ind, node=False)
        if not targets:
            return [(p.inner, v)]
        f, step = self.fail(s), self.const(p.step)
        cur, chain = v, []
        for t in targets:
            k = self.const(t)
            self.line(ind, f"if {cur}.__class__ is not Node or {cur}.target is not {k}: {f}")
            nxt = self.local("c")
            self.line(ind, f"{nxt} = {step}({cur})")
            self.line(ind, f"if {nxt} is None: {f}")
            chain.append(cur)
            cur = nxt
        run = self.local("run")
        self.line(ind, f"{run} = ({', '.join(reversed(chain))},)")  # innermost first
        s.chains.append(run)
        return [(p.inner, cur)]

    def scalar(self, p: Scalar, v: str, s: _Static, ind: int) -> None:
        num, t = self.local("n"), self.const(p.types)
        self.line(ind, f"{num} = _constant_number({v}) if {v}.__class__ is Node else {v}")
        self.line(ind, f"if not _is_a({num}, {t}): {self.fail(s)}")
        self.bind(p, num, s, ind, node=False)

    def op(self, p: P, v: str, s: _Static, ind: int):
        """Checks for the op node in ``v``; returns (indent, pending children) where a
        deferred operand swap is a ("swap", ...) item for the end of the pending list."""
        f = self.fail(s)
        self.line(ind, f"if {v}.__class__ is not Node: {f}")
        if p._shared and id(p) in s.memo:
            self.line(ind, f"if {v} is not {s.memo[id(p)]}: {f}")
            return ind, None, []
        single = len(p.fns) == 1 and not (p.packets or p.methods or p.modules)
        if single and not p.one_spelling:  # a spelling with another schema takes the general path
            single = not has_dim_order_spelling(next(iter(p.fns)))
        r = None
        if self.path is not None:  # the target the path recorded, nothing else
            target = self.path.targets[id(p)]
            r = p.layout(target)
            self.line(ind, f"if {v}.target is not {self.const(target)}: {f}")
            rv = self.const(r)
        elif single:
            (target,) = p.fns
            r = p.layout(target)
            if not r.ok:
                self.line(ind, f)  # can never match
                return ind, [], []
            k = self.const(target)
            if p.one_spelling:
                self.line(ind, f"if {v}.target is not {k}: {f}")
            else:  # or an Edge op wrapping it, whose schema is the same
                self.line(
                    ind, f"if {v}.target is not {k} and _edge_wrapped({v}.target) is not {k}: {f}"
                )
            rv = self.const(r)
        else:
            pk = self.const(p)
            rv = self.local("r")
            self.line(ind, f"if not {pk}.accepts({v}): {f}")
            res = f"{pk}.layout({v}.target if {v}.op == 'call_function' else {v}.op)"
            self.line(ind, f"{rv} = {res}")
            self.line(ind, f"if not {rv}.ok: {f}")
        self.bind(p, v, s, ind, node=True)
        if p.constraint is not None:
            c = self.const(p.constraint)
            self.line(ind, f"if {c}.failure({v}, {v}) is not None: {f}")
        if r is None or r.pos_limit >= 0:
            check = f"({rv}.unmentioned or {rv}.pos_limit >= 0) and " if r is None else ""
            self.line(
                ind,
                f"if {check}not _strict_ok({rv}, {v}.{ARGS_ATTR}, {v}.{KWARGS_ATTR}, _lit_eq): {f}",
            )
        elif r.unmentioned:  # arguments left out must hold their defaults: inline checks
            u = self.local("u")
            for index, name, default in r.unmentioned:
                d = self.const(default)
                fetch = f"{v}.{KWARGS_ATTR}.get({name!r}, {d})"
                if index >= 0:
                    fetch = (
                        f"{v}.{ARGS_ATTR}[{index}] if len({v}.{ARGS_ATTR}) > {index} else {fetch}"
                    )
                self.line(ind, f"{u} = {fetch}")
                self.line(ind, f"if not ({u} is {d} or _lit_eq({d}, {u})): {f}")
        s.nodes.append(v)
        children = list(p.children())
        if not children:
            return ind, [], []
        a = self.local("a")
        self.line(ind, f"{a} = {rv}.getter({v}.{ARGS_ATTR}, {v}.{KWARGS_ATTR})")

        def slot(k: int) -> str:
            return f"{a}[{r.child_slot[k]}]" if r is not None else f"{a}[{rv}.child_slot[{k}]]"

        locs = [self.local("x") for _ in children]
        start, deferred = 0, []
        if p.commutative and len(children) >= 2 and len(p.args) >= 2 and self.path is None:
            if rank(children[0]) >= 3 and rank(children[1]) >= 3:
                # swapping only changes bindings: choose late, after the structure matched
                e0, e1 = self.local("e"), self.local("e")
                self.line(ind, f"{e0}, {e1} = {slot(0)}, {slot(1)}")
                deferred = [("swap", children[0], children[1], e0, e1)]
            else:
                self.line(
                    ind,
                    f"for {locs[0]}, {locs[1]} in "
                    f"(({slot(0)}, {slot(1)}), ({slot(1)}, {slot(0)})):",
                )
                ind += 1
                s.depth += 1
            start = 2
        for k in range(start, len(children)):
            self.line(ind, f"{locs[k]} = {slot(k)}")
        first = 2 if start == 2 else 0
        order = child_order(children, r.child_slot if r is not None else None)
        items = [(children[k], locs[k]) for k in order if k >= first or not deferred]
        return ind, items, deferred

    def success(self, s: _Static, ind: int) -> None:
        env = ", ".join(f"{name!r}: {loc}" for name, loc in s.bound.items())
        self.line(ind, f"st.env = {{{env}}}")
        self.line(ind, f"st.nodes = [{', '.join(s.nodes)}]")
        if s.chains:
            self.line(ind, f"st.chains = [{', '.join(s.chains)}]")
        if self.path is not None:  # one way through: no later alternative to try here
            self.line(ind, f"return True if final({self.rule}, st) else None")
            return
        self.line(ind, f"if final({self.rule}, st):")
        self.line(ind + 1, "return True")


def child_order(children: list[Pattern], slots: list[int] | None) -> list[int]:
    """Indices of an op pattern's ``children`` in the order they are matched: by
    :func:`~fxpass.rewrite.arguments.rank`, ties in argument (slot) order, as the
    interpreter does when ``slots`` (each child's slot in the target's layout) are known."""
    return sorted(
        range(len(children)),
        key=lambda k: (rank(children[k]), slots[k] if slots is not None else k),
    )
