"""The pattern language: what a rule looks for in an FX graph, written as data.

>>> from fxpass.rewrite import P
>>> aten = torch.ops.aten
>>> x = P.var("x")
>>> P(aten.mul.Tensor, x, 1)                          # x * 1 (either operand order)
>>> P(aten.pow.Tensor_Scalar, x, P.const("e", float)) # any float exponent, captured as ``e``
>>> P({aten.rsqrt.default, torch.rsqrt, "rsqrt"}, x)  # an op set: ATen, torch-level, method
>>> P.cast(x, torch.float32, optional=True)           # x, or x converted to float32
>>> P(aten._to_copy.default, x, ...)                  # ``...``: the remaining arguments are free

Building blocks:

* ``P(op, *args, **kwargs)`` matches a node calling ``op`` (an ``OpOverload``; an
  ``OpOverloadPacket`` for any overload; a Python callable such as ``operator.add``; a
  string for a ``call_method``; or a set of these) whose arguments match ``args`` and
  ``kwargs``. Arguments are sub-patterns or literals (a literal must be equal). For ATen ops
  the arguments are compared by the op's schema: keyword or positional spelling does not
  matter, and arguments the pattern leaves out must have their default value (write ``...``
  as the last positional argument to leave them free). An op stands for all its spellings:
  ``aten.add.Tensor`` and ExecuTorch's ``exir_ops.edge.aten.add.Tensor`` match each other's
  nodes, and ``aten._to_copy``/``aten.clone`` match Edge's dim-order copies.
* ``P.var(name, dtype=, rank=, shape=, where=)`` matches any value (a node or a literal) and
  binds it; the same name used twice must bind the same value. Constraints read the node's
  ``meta['val']``.
* ``P.const(name, type, where=)`` matches any literal (not a node): a wildcard for ``eps``.
* ``P.any_of(a, b)`` or ``a | b``: alternatives, tried in order (with backtracking).
* ``P.cast(x, dtype, optional=)``, ``P.maybe(op, x)``: optional wrappers.
* ``P.through(x, views=, casts=)``: ``x``, possibly behind views/reshapes that keep the last
  dimension and no-op casts (any dialect); a replacement that commutes with them is given
  back the shapes the replaced nodes had.
* ``P.scalar(name)``: a number, literal or lifted into a one-element constant tensor.
* ``.named(name)`` binds the matched node; ``.check(dtype=, rank=, shape=, where=)`` adds
  constraints on it; ``.commute(False)`` turns off operand swapping (on by default for
  ``add``/``mul`` and other symmetric ops).

Using the same pattern object twice makes the pattern a DAG: both uses must match the same
node. Every pattern remembers the ``file:line`` where it was written (``.location``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from typing import Any

from torch.fx import Node

from ..edit.location import caller_location
from ..fxutil.dialect import aten_op, is_edge_op
from ..fxutil.views import keeps_rows
from .arguments import Layout, layout
from .constraint import Constraint, is_noop_cast, is_pure_cast
from .spelling import CAST_OPS, SYMMETRIC, Module, OpOverload, OpOverloadPacket, op_name

__all__ = ["CAST_OPS", "P", "Pattern", "Scalar", "Through"]


class Pattern:
    """Base class of all patterns: data that the matchers (:mod:`~fxpass.rewrite.interpret`,
    :mod:`~fxpass.rewrite.compile`) read."""

    __slots__ = ("_shared", "location", "name")

    RANK = 3  # see fxpass.rewrite.arguments.rank
    LITERAL = False
    free = False  # matches anything and binds nothing: the matchers skip it

    def __init__(self, name: str | None = None, location: str | None = None) -> None:
        self.name = name
        self.location = location or caller_location()
        self._shared = False

    # ----- introspection ----------------------------------------------------------------
    def index_keys(self) -> frozenset | None:
        """Keys (see :func:`~fxpass.rewrite.spelling.node_key`) of the nodes this pattern
        can match; None: any node."""
        return None

    def first_keys(self) -> tuple[frozenset, bool] | None:
        """Keys of the ops this pattern's top node can call (ids for functions), and whether
        any is an op packet; None when it can match anything."""
        return None

    def children(self) -> Iterable[Pattern]:
        return ()

    def walk(self) -> Iterable[Pattern]:
        """This pattern and every pattern inside it, each object once."""
        seen: set[int] = set()
        stack: list[Pattern] = [self]
        while stack:
            p = stack.pop()
            if id(p) in seen:
                continue
            seen.add(id(p))
            yield p
            stack.extend(reversed(list(p.children())))

    def names(self) -> list[str]:
        """Every name this pattern binds, in the order they appear."""
        out: list[str] = []
        for p in self.walk():
            if p.name and p.name not in out:
                out.append(p.name)
        return out

    # ----- building ---------------------------------------------------------------------
    def named(self, name: str) -> Pattern:
        """A copy that binds the matched node (or value) to ``name``."""
        clone = copy.copy(self)
        clone.name = name
        return clone

    def __or__(self, other: Any) -> Pattern:
        return AnyOf([self, _as_pattern(other)], location=caller_location())

    def __ror__(self, other: Any) -> Pattern:
        return AnyOf([_as_pattern(other), self], location=caller_location())


def _as_pattern(x: Any) -> Pattern:
    if isinstance(x, Pattern):
        return x
    if isinstance(x, (list, tuple)) and any(isinstance(e, Pattern) for e in x):
        return Seq(x)
    return Lit(x)


# ----- leaves -----------------------------------------------------------------------------
class Lit(Pattern):
    """A literal argument: equal values match."""

    __slots__ = ("value",)
    RANK = 0
    LITERAL = True

    def __init__(self, value: Any, location: str | None = None) -> None:
        super().__init__(None, location or "")
        self.value = value

    def __repr__(self) -> str:
        return repr(self.value)


class Var(Pattern):
    """Any value (node or literal), bound to ``name``; optional constraints on its meta."""

    __slots__ = ("constraint", "node_only")

    def __init__(self, name=None, *, constraint=None, node_only=False, location=None) -> None:
        super().__init__(name, location)
        self.constraint = constraint if constraint else None
        self.node_only = node_only

    @property
    def free(self) -> bool:
        return self.name is None and self.constraint is None and not self.node_only

    def __repr__(self) -> str:
        return self.name or "_"


class Const(Pattern):
    """Any literal (not a node) of the given types, bound to ``name``: e.g. ``eps``."""

    __slots__ = ("types", "where")

    def __init__(self, name=None, types=None, *, where=None, location=None) -> None:
        super().__init__(name, location)
        if isinstance(types, type):
            types = (types,)
        self.types = tuple(types) if types else None
        self.where = where

    def __repr__(self) -> str:
        return f"const({self.name or ''})"


class Seq(Pattern):
    """A list or tuple argument whose elements are patterns (e.g. ``cat([a, b])``)."""

    __slots__ = ("items",)
    RANK = 2

    def __init__(self, items: Iterable[Any], location: str | None = None) -> None:
        super().__init__(None, location or "")
        self.items = [_as_pattern(i) for i in items]

    def children(self):
        return self.items

    def __repr__(self) -> str:
        return "[" + ", ".join(map(repr, self.items)) + "]"


class AnyOf(Pattern):
    """Alternatives, tried in order; a later one is tried when the rest of the match fails."""

    __slots__ = ("options",)
    RANK = 2

    def __init__(self, options: Iterable[Any], *, name=None, location=None) -> None:
        super().__init__(name, location)
        opts: list[Pattern] = []
        for o in options:
            o = _as_pattern(o)
            if isinstance(o, AnyOf) and o.name is None:
                opts.extend(o.options)
            else:
                opts.append(o)
        self.options = opts

    def children(self):
        return self.options

    def index_keys(self):
        keys: set = set()
        for o in self.options:
            ks = o.index_keys()
            if ks is None:
                return None
            keys |= ks
        return frozenset(keys)

    def first_keys(self):
        keys, packets = set(), False
        for o in self.options:
            sub = o.first_keys()
            if sub is None:
                return None
            keys |= sub[0]
            packets |= sub[1]
        return frozenset(keys), packets

    def __repr__(self) -> str:
        return "(" + " | ".join(map(repr, self.options)) + ")"


# ----- seeing through ops that keep the values ----------------------------------------------
class Through(Pattern):
    """``inner`` at the value, or at the value behind a chain of ops that leave each of its
    rows (its values along the last dimension) as they are: shape-only ops that keep the
    last dimension (``views``) and casts to the dtype a value already has (``casts``).

    The chain's nodes are not part of the match: they stay in the graph (reading whatever
    replaces what they read) and go when nothing uses them any more. A chain that starts at
    an inner node of the match must be used only inside it, like any inner node. When a
    replacement's value has the shape of the chain's input where the replaced node had the
    shape of its output, the rewriter replays the chain on it (see :meth:`P.through`).
    """

    __slots__ = ("casts", "inner", "views")
    MAX_CHAIN = 16  # a longer run of views between two ops is no spelling anyone writes

    def __init__(self, inner: Any, *, views: bool, casts: bool, location=None) -> None:
        super().__init__(None, location)
        self.inner = _as_pattern(inner)
        self.views = views
        self.casts = casts

    def children(self):
        return [self.inner]

    def step(self, v: Any) -> Node | None:
        """The input of ``v`` when ``v`` is an op this pattern sees through, else None."""
        if v.__class__ is not Node or v.op not in ("call_function", "call_method"):
            return None
        src = v.args[0] if v.args else None
        if src.__class__ is not Node:
            return None
        if self.casts and is_noop_cast(v):
            return src
        if self.views and keeps_rows(v):
            return src
        return None

    def __repr__(self) -> str:
        what = "+".join(w for w, on in (("views", self.views), ("casts", self.casts)) if on)
        text = f"through[{what}]({self.inner!r})"
        return f"{text}.named({self.name!r})" if self.name else text


class Scalar(Pattern):
    """A number: a literal, or a one-element constant tensor standing for one (ExecuTorch's
    Edge programs lift ``x + 1e-6`` into ``x + _lifted_tensor_constant``). Binds the number."""

    __slots__ = ("types",)

    def __init__(self, name=None, types=None, *, location=None) -> None:
        super().__init__(name, location)
        if isinstance(types, type):
            types = (types,)
        self.types = tuple(types) if types else (int, float)

    def __repr__(self) -> str:
        return f"scalar({self.name or ''})"


# ----- op patterns ------------------------------------------------------------------------
class P(Pattern):
    """A node calling one of a set of ops, with argument patterns. See the module docstring."""

    __slots__ = (
        "_cache",
        "_keep",
        "_rejected",
        "args",
        "commutative",
        "constraint",
        "fn_ids",
        "fns",
        "free_rest",
        "kwargs",
        "label",
        "methods",
        "modules",
        "one_spelling",
        "packets",
    )
    RANK = 1

    def __init__(self, op: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(None, caller_location())
        ops = op if isinstance(op, (set, frozenset, list, tuple)) else [op]
        fns, packets, methods, modules = set(), set(), set(), set()
        for o in ops:
            if is_edge_op(o):  # an Edge op is its ATen op: the pattern matches both spellings
                o = aten_op(o)
            if isinstance(o, str):
                methods.add(o)
            elif isinstance(o, OpOverloadPacket):
                packets.add(o)
            elif isinstance(o, Module):
                modules.add(o.target)
            elif callable(o):
                fns.add(o)
            else:
                raise TypeError(
                    f"P(op, ...): op must be an ATen/custom op, a Python callable, a method "
                    f"name (str) or a set of these; got {o!r}"
                )
        if not ops:
            raise ValueError("P(op, ...) needs at least one op")
        self.fns = frozenset(fns)
        # OpOverload.__hash__ is Python code; ids of the (long-lived) targets hash in C.
        self.fn_ids = frozenset(id(f) for f in fns)
        self.packets = frozenset(packets)
        self.methods = frozenset(methods)
        self.modules = frozenset(modules)
        free_rest = bool(args) and args[-1] is Ellipsis
        if free_rest:
            args = args[:-1]
        if any(a is Ellipsis for a in args):
            raise ValueError("'...' may only be the last positional argument of a pattern")
        self.free_rest = free_rest
        self.args = [_as_pattern(a) for a in args]
        self.kwargs = {key: _as_pattern(a) for key, a in kwargs.items()}
        everything = list(fns) + list(packets) + list(methods)
        self.commutative = (
            len(self.args) >= 2 and bool(everything) and all(o in SYMMETRIC for o in everything)
        )
        self.constraint: Constraint | None = None
        self.label: str | None = None  # a short name for the op set in messages
        self.one_spelling = False  # True: only these targets, not their Edge spellings
        self._cache: dict[int, Layout] = {}
        self._keep: list[Any] = []
        self._rejected: dict[int, Any] = {}  # id -> call_function target it does not call
        for f in fns:
            if isinstance(f, OpOverload):
                self.layout(f, eager=True)

    # ----- building ---------------------------------------------------------------------
    @staticmethod
    def var(
        name: str | None = None,
        *,
        dtype: Any = None,
        rank: Any = None,
        shape: Any = None,
        where: Callable[[Any], bool] | None = None,
    ) -> Var:
        """Any value, bound to ``name``; ``dtype``/``rank``/``shape`` check its meta['val']."""
        c = Constraint(dtype, rank, shape, where)
        return Var(name, constraint=c if c else None, location=caller_location())

    @staticmethod
    def node(name: str | None = None, **constraints: Any) -> Var:
        """Like :meth:`var`, but only a graph node matches (no literal)."""
        c = Constraint(**constraints)
        return Var(name, constraint=c if c else None, node_only=True, location=caller_location())

    @staticmethod
    def const(
        name: str | None = None, types: Any = None, *, where: Callable[[Any], bool] | None = None
    ) -> Const:
        """Any literal (a number, list, dtype...) of ``types``, bound to ``name``."""
        return Const(name, types, where=where, location=caller_location())

    @staticmethod
    def any() -> Var:
        """Anything at all (not bound)."""
        return Var(None, location=caller_location())

    @staticmethod
    def any_of(*options: Any, name: str | None = None) -> AnyOf:
        """The first of ``options`` that leads to a complete match."""
        return AnyOf(options, name=name, location=caller_location())

    @staticmethod
    def method(name: str, *args: Any, **kwargs: Any) -> P:
        """A ``call_method`` node (Dynamo and symbolic_trace graphs): ``P.method("float", x)``."""
        p = P(name, *args, **kwargs)
        p.location = caller_location()
        return p

    @staticmethod
    def module(target: str, *args: Any, **kwargs: Any) -> P:
        """A ``call_module`` node calling the submodule ``target``."""
        p = P(Module(target), *args, **kwargs)
        p.location = caller_location()
        return p

    @staticmethod
    def exact(op: Any, *args: Any, **kwargs: Any) -> P:
        """``op(*args, **kwargs)`` compared as torch's matcher compares nodes: the target is
        ``op`` itself (an op packet matches only nodes calling the packet, not its
        overloads) and the operands are in the given order (no commutative swap)."""
        p = P(op, *args, **kwargs)
        if isinstance(op, OpOverloadPacket) or is_edge_op(op):
            p.fns, p.fn_ids, p.packets = frozenset([op]), frozenset([id(op)]), frozenset()
        p.commutative = False
        p.one_spelling = True
        p.location = caller_location()
        return p

    @staticmethod
    def cast(x: Any, dtype: Any = None, *, optional: bool = False) -> Pattern:
        """``x`` converted to ``dtype`` (any dtype if None) by any cast op; or ``x`` itself
        when ``optional``. Only pure dtype conversions match (same shape and device)."""
        loc = caller_location()
        c = P(CAST_OPS, x, ...)
        c.location = loc
        c.commutative = False
        c.label = "cast" if dtype is None else f"cast[{dtype}]"
        c.constraint = Constraint(dtype=dtype, where=is_pure_cast)
        if not optional:
            return c
        return AnyOf([c, x], location=loc)

    @staticmethod
    def through(x: Any, *, views: bool = True, casts: bool = True) -> Through:
        """``x``, possibly behind ops that leave each row of it (its values along the last
        dimension) as it is: with ``views``, shape-only ops that keep the last dimension
        (view, reshape, flatten, squeeze/unsqueeze, expand, permute/transpose or
        slice/select of the other dimensions, alias, clone, contiguous — ATen, Edge
        ``*_copy``, dim-order and method spellings); with ``casts``, casts to the dtype the
        value already has (``aten.to``, ``_to_copy``, ``_to_dim_order_copy``, ``.float()``...).

        Use it where the rule's replacement commutes with those ops — a row-wise op (a norm
        or softmax over the last dimension) or an element-wise one — so that the
        replacement can compute on the chain's input: when a replacement's value has the
        chain input's shape where the replaced node had the chain output's, the rewriter
        applies the chain's ops to it again. Name it (``.named``) to bind the value at the
        top of the chain; the names inside bind what the chain starts from.
        """
        return Through(x, views=views, casts=casts, location=caller_location())

    @staticmethod
    def scalar(name: str | None = None, types: Any = None) -> Scalar:
        """A number of ``types`` (default int or float), bound to ``name``: a literal, or a
        one-element constant tensor that a graph lifted out of one (``x + 1e-6`` is ``x +
        _lifted_tensor_constant`` in ExecuTorch's Edge programs)."""
        return Scalar(name, types, location=caller_location())

    @staticmethod
    def maybe(op: Any, x: Any, *args: Any, **kwargs: Any) -> Pattern:
        """``op(x, *args)`` or just ``x``: an optional unary wrapper."""
        loc = caller_location()
        p = P(op, x, *args, **kwargs)
        p.location = loc
        return AnyOf([p, x], location=loc)

    def check(
        self,
        *,
        dtype: Any = None,
        rank: Any = None,
        shape: Any = None,
        where: Callable[[Node], bool] | None = None,
    ) -> P:
        """A copy that also requires the matched node's meta['val'] to satisfy these."""
        clone = copy.copy(self)
        old = self.constraint
        if old is not None:
            dtype = dtype if dtype is not None else old.dtype
            rank = rank if rank is not None else old.rank
            shape = shape if shape is not None else old.shape
            if where is not None and old.where is not None:
                first, second = old.where, where
                where = lambda n: first(n) and second(n)  # noqa: E731
            where = where or old.where
        clone.constraint = Constraint(dtype, rank, shape, where)
        return clone

    def commute(self, flag: bool = True) -> P:
        """A copy whose first two operands may (or, with False, may not) be swapped."""
        clone = copy.copy(self)
        clone.commutative = flag and len(self.args) >= 2
        return clone

    # ----- introspection ----------------------------------------------------------------
    def children(self):
        return [*self.args, *self.kwargs.values()]

    def index_keys(self):
        return frozenset(
            [
                *self.fns,
                *self.packets,
                *(("method", m) for m in self.methods),
                *(("module", m) for m in self.modules),
            ]
        )

    def first_keys(self):
        keys = {id(f) for f in self.fns} | {id(f) for f in self.packets}
        keys |= {("method", m) for m in self.methods} | {("module", m) for m in self.modules}
        return frozenset(keys), bool(self.packets)

    def ops(self) -> list[Any]:
        return [*self.fns, *self.packets, *self.methods, *(Module(m) for m in self.modules)]

    def describe_ops(self) -> str:
        if self.label:
            return self.label
        names = sorted(op_name(o) for o in [*self.fns, *self.packets, *self.methods])
        names += sorted(f"module {m}" for m in self.modules)
        return names[0] if len(names) == 1 else "{" + ", ".join(names) + "}"

    def __repr__(self) -> str:
        parts = [repr(a) for a in self.args]
        parts += [f"{k}={v!r}" for k, v in self.kwargs.items()]
        if self.free_rest:
            parts.append("...")
        head = self.describe_ops()
        text = f"{head}({', '.join(parts)})"
        return f"{text}.named({self.name!r})" if self.name else text

    # ----- what the matchers ask of an op pattern ---------------------------------------
    def accepts(self, v: Node) -> bool:
        """Does node ``v`` call one of this pattern's ops (in any spelling)?"""
        op = v.op
        if op == "call_function":
            t = v.target
            if id(t) in self.fn_ids:
                return True
            if self._rejected.get(id(t)) is t:  # asked before: no
                return False
            if self.packets and getattr(t, "overloadpacket", None) in self.packets:
                return True
            if not self.one_spelling:
                a = aten_op(t)  # an Edge (or dim-order) spelling of an op in the set
                if a is not t and (
                    id(a) in self.fn_ids or getattr(a, "overloadpacket", None) in self.packets
                ):
                    self.fn_ids = self.fn_ids | {id(t)}  # the next look-up is one set probe
                    self._keep.append(t)
                    return True
            if len(self._rejected) < 256:
                self._rejected[id(t)] = t  # the target keeps its id valid
            return False
        if op == "call_method":
            return v.target in self.methods
        if op == "call_module":
            return v.target in self.modules
        return False

    def layout(self, target: Any, eager: bool = False) -> Layout:
        """The argument layout for ``target`` (a call_function target, or an op name)."""
        key = id(target)
        r = self._cache.get(key)
        if r is None:
            r = self._cache[key] = layout(self, target, eager)
            self._keep.append(target)  # keeps the id valid while cached
        return r
