"""The pattern language: what a rule looks for in an FX graph, written as data.

>>> import torch
>>> from fxpass.rewrite import P
>>> aten = torch.ops.aten
>>> x = P.var("x")
>>> P(aten.mul.Tensor, x, 1)                          # x * 1 (either operand order)
aten.mul.Tensor(x, 1)
>>> P(aten.pow.Tensor_Scalar, x, P.const("e", float)) # any float exponent, captured as ``e``
aten.pow.Tensor_Scalar(x, const(e))
>>> P({aten.rsqrt.default, torch.rsqrt, "rsqrt"}, x)  # an op set: ATen, torch-level, method
{.rsqrt(), aten.rsqrt.default, torch.rsqrt}(x)
>>> P.cast(x, torch.float32, optional=True)           # x, or x converted to float32
(cast[torch.float32](x, ...) | x)
>>> P(aten._to_copy.default, x, ...)                  # ``...``: the remaining arguments are free
aten._to_copy.default(x, ...)

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
from collections.abc import Callable
from typing import Any

from torch.fx import Node

from ..edit.location import caller_location
from ..fxutil.dialect import aten_op, is_edge_op
from .arguments import Layout, layout
from .constraint import Constraint, is_pure_cast
from .leaves import AnyOf, Const, Pattern, Scalar, Through, Var, as_pattern
from .spelling import CAST_OPS, SYMMETRIC, Module, OpOverload, OpOverloadPacket, op_name

__all__ = ["CAST_OPS", "P", "Pattern", "Scalar", "Through"]


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
        self.args = [as_pattern(a) for a in args]
        self.kwargs = {key: as_pattern(a) for key, a in kwargs.items()}
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
