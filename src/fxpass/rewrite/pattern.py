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
import operator
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.fx import Node

from ..edit.location import caller_location
from ..fxutil.dialect import aten_op, is_edge_op
from ..fxutil.views import keeps_rows
from ._state import MISSING, MatchState

__all__ = ["CAST_OPS", "P", "Pattern", "Scalar", "Through"]

aten = torch.ops.aten
prims = torch.ops.prims

_OpOverload = torch._ops.OpOverload
_OpOverloadPacket = torch._ops.OpOverloadPacket

# Ops whose first two operands may be swapped without changing the result.
_SYMMETRIC: frozenset[Any] = frozenset(
    [
        aten.add.Tensor,
        aten.add.Scalar,
        aten.mul.Tensor,
        aten.mul.Scalar,
        aten.maximum.default,
        aten.minimum.default,
        aten.logical_and.default,
        aten.logical_or.default,
        aten.eq.Tensor,
        aten.ne.Tensor,
        operator.add,
        operator.mul,
        torch.add,
        torch.mul,
        torch.maximum,
        torch.minimum,
        "add",
        "mul",
    ]
)

#: Ops (and methods) that convert a tensor's dtype; their first argument is the input.
CAST_OPS: frozenset[Any] = frozenset(
    [
        aten._to_copy.default,
        aten.to.dtype,
        aten.to.dtype_layout,
        aten.type_as.default,
        prims.convert_element_type.default,
        "to",
        "float",
        "half",
        "bfloat16",
        "double",
        "type",
        "type_as",
    ]
)


def op_name(target: Any) -> str:
    """A readable name for an op target (``aten.mul.Tensor``, ``operator.add``, ``.float()``)."""
    if isinstance(target, str):
        return f".{target}()"
    if isinstance(target, (_OpOverload, _OpOverloadPacket)):
        return str(target)
    module = getattr(target, "__module__", None) or ""
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", repr(target))
    module = {
        "_operator": "operator",
        "torch._C._VariableFunctions": "torch",
        "torch._VariableFunctionsClass": "torch",
        "torch._C._nn": "torch._C._nn",
    }.get(module, module)
    if module == "torch" or name.startswith("_VariableFunctionsClass."):
        return f"torch.{getattr(target, '__name__', name)}"
    return f"{module}.{name}" if module else name


def node_key(node: Node) -> Any:
    """The key an op-indexed matcher files ``node`` under (see :meth:`Pattern.index_keys`)."""
    op = node.op
    if op == "call_function":
        return node.target
    if op == "call_method":
        return ("method", node.target)
    if op == "call_module":
        return ("module", node.target)
    return (op,)


def value_of(v: Any) -> Any:
    """The value a pattern constraint inspects: a node's ``meta['val']`` (or Dynamo's
    ``example_value``, or ``tensor_meta``)."""
    if isinstance(v, Node):
        meta = v.meta
        val = meta.get("val", MISSING)
        if val is MISSING:  # Dynamo graphs keep fake values as example_value
            val = meta.get("example_value", MISSING)
            if val is MISSING:
                val = meta.get("tensor_meta", MISSING)
        return val
    return v


def _lit_eq(p: Any, v: Any) -> bool:
    """Literal equality: bools only equal bools; lists equal tuples element-wise."""
    if p is v:
        return True
    tp, tv = type(p), type(v)
    if tp is bool or tv is bool:
        return tp is tv and p == v
    if isinstance(p, (list, tuple)):
        return (
            isinstance(v, (list, tuple))
            and len(p) == len(v)
            and all(_lit_eq(a, b) for a, b in zip(p, v))
        )
    if isinstance(v, (Node, list, tuple)):
        return False
    try:
        return bool(p == v)
    except Exception:
        return False


def _lit_eq_exact(p: Any, v: Any) -> bool:
    """torch's rule: the same Python type and equal (lists recurse element-wise)."""
    if isinstance(p, (list, tuple)) and isinstance(v, (list, tuple)):
        return len(p) == len(v) and all(_lit_eq_exact(a, b) for a, b in zip(p, v))
    try:
        return type(p) is type(v) and bool(p == v)
    except Exception:
        return False


def lit_ok(p: Any, v: Any, st: MatchState) -> bool:
    if st.ignore_literals:
        return True
    return _lit_eq_exact(p, v) if st.exact_literals else _lit_eq(p, v)


class Pattern:
    """Base class of all patterns. Subclasses implement ``_m(value, state, k) -> bool``."""

    __slots__ = ("_shared", "location", "name")

    def __init__(self, name: str | None = None, location: str | None = None) -> None:
        self.name = name
        self.location = location or caller_location()
        self._shared = False

    # ----- matching ---------------------------------------------------------------------
    def _m(self, v: Any, st: MatchState, k: Callable[[], bool]) -> bool:  # pragma: no cover
        raise NotImplementedError

    def index_keys(self) -> frozenset | None:
        """Keys (see :func:`node_key`) of the nodes this pattern can match; None: any node."""
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

    def _bind(self, v: Any, st: MatchState, k: Callable[[], bool]) -> bool:
        """Bind ``self.name`` (and the DAG memo) to ``v``, run ``k``, undo on failure."""
        name = self.name
        fresh = False
        if name is not None:
            prev = st.env.get(name, MISSING)
            if prev is MISSING:
                st.env[name] = v
                fresh = True
            elif not (prev is v or (not isinstance(v, Node) and _lit_eq(prev, v))):
                if st.explain:
                    return st.miss(
                        lambda: (
                            f"'{name}' is already bound to {_show(prev)}, "
                            f"but here it would be {_show(v)}"
                        ),
                        v,
                    )
                return False
        if self._shared:
            st.memo[id(self)] = v
        if k():
            return True
        if fresh:
            del st.env[name]
        if self._shared:
            st.memo.pop(id(self), None)
        return False

    def _memo_hit(self, v: Any, st: MatchState, k: Callable[[], bool]) -> bool | None:
        prev = st.memo.get(id(self), MISSING)
        if prev is MISSING:
            return None
        if prev is v or (not isinstance(v, Node) and _lit_eq(prev, v)):
            return k()
        if st.explain:
            if self.name:
                msg = f"'{self.name}' is already bound to {_show(prev)}, but here it would be {_show(v)}"
            else:
                msg = f"this pattern already matched {_show(prev)}; here it meets {_show(v)}"
            return st.miss(lambda: msg, v)
        return False


def _show(v: Any) -> str:
    if isinstance(v, Node):
        return f"%{v.name}"
    return repr(v)


def _as_pattern(x: Any) -> Pattern:
    if isinstance(x, Pattern):
        return x
    if isinstance(x, (list, tuple)) and any(isinstance(e, Pattern) for e in x):
        return Seq(x)
    return Lit(x)


# ----- constraints on meta['val'] -----------------------------------------------------------
class Constraint:
    """dtype / rank / shape / predicate constraints on a value's ``meta['val']``."""

    __slots__ = ("dtype", "rank", "shape", "where")

    def __init__(self, dtype=None, rank=None, shape=None, where=None) -> None:
        if isinstance(dtype, torch.dtype):
            dtype = frozenset([dtype])
        elif dtype is not None:
            dtype = frozenset(dtype)
        if isinstance(rank, int):
            rank = frozenset([rank])
        elif rank is not None:
            rank = frozenset(rank)
        self.dtype = dtype
        self.rank = rank
        self.shape = tuple(shape) if shape is not None else None
        self.where = where

    def __bool__(self) -> bool:
        return any(x is not None for x in (self.dtype, self.rank, self.shape, self.where))

    def failure(self, v: Any, what: Any = None) -> str | None:
        """None if ``v`` satisfies the constraints, else why not."""
        if self.dtype is not None or self.rank is not None or self.shape is not None:
            val = value_of(v)
            if val is MISSING:
                return f"{_show(v)} has no meta['val'] to check dtype/rank/shape against"
            if self.dtype is not None:
                dt = getattr(val, "dtype", None)
                if dt not in self.dtype:
                    want = " or ".join(sorted(str(d) for d in self.dtype))
                    return f"dtype of {_show(v)} is {dt}, expected {want}"
            shape = getattr(val, "shape", None)
            if self.rank is not None and (shape is None or len(shape) not in self.rank):
                n = None if shape is None else len(shape)
                return f"rank of {_show(v)} is {n}, expected {sorted(self.rank)}"
            if self.shape is not None:
                if shape is None or len(shape) != len(self.shape):
                    return f"shape of {_show(v)} is {shape}, expected {self.shape}"
                for have, want in zip(shape, self.shape):
                    if want is not None and have != want:
                        return f"shape of {_show(v)} is {tuple(shape)}, expected {self.shape}"
        if self.where is not None:
            try:
                ok = self.where(what if what is not None else v)
            except Exception as e:  # a predicate that cannot decide says no
                return f"predicate {_fn_name(self.where)} raised {type(e).__name__}: {e}"
            if not ok:
                return f"predicate {_fn_name(self.where)} is false for {_show(v)}"
        return None


def _fn_name(fn: Any) -> str:
    name = getattr(fn, "__name__", repr(fn))
    code = getattr(fn, "__code__", None)
    if name == "<lambda>" and code is not None:
        return f"<lambda at line {code.co_firstlineno}>"
    return name


# ----- leaves -----------------------------------------------------------------------------
class Lit(Pattern):
    """A literal argument: equal values match."""

    __slots__ = ("value",)

    def __init__(self, value: Any, location: str | None = None) -> None:
        super().__init__(None, location or "")
        self.value = value

    def _m(self, v, st, k):
        if lit_ok(self.value, v, st):
            return k()
        if st.explain:
            return st.miss(lambda: f"literal differs: expected {self.value!r}, got {_show(v)}", v)
        return False

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

    def _m(self, v, st, k):
        if self._shared:
            hit = self._memo_hit(v, st, k)
            if hit is not None:
                return hit
        if self.node_only and not isinstance(v, Node):
            if st.explain:
                return st.miss(lambda: f"expected a node for '{self.name}', got {v!r}", v)
            return False
        c = self.constraint
        if c is not None:
            why = c.failure(v)
            if why is not None:
                return st.miss(lambda: why, v) if st.explain else False
        if st.injective and isinstance(v, Node):
            owner = st.used.get(v, MISSING)
            if owner is not MISSING and owner is not self:
                if st.explain:
                    return st.miss(lambda: f"{_show(v)} is already matched elsewhere", v)
                return False
            if owner is MISSING:
                st.used[v] = self
                if self._bind(v, st, k):
                    return True
                del st.used[v]
                return False
        return self._bind(v, st, k)

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

    def _m(self, v, st, k):
        if isinstance(v, Node):
            if st.explain:
                return st.miss(lambda: f"expected a literal for '{self.name}', got node {_show(v)}")
            return False
        if self.types is not None:
            ok = isinstance(v, self.types) and not (
                type(v) is bool and bool not in self.types and int in self.types
            )
            if not ok:
                if st.explain:
                    want = "/".join(t.__name__ for t in self.types)
                    return st.miss(lambda: f"expected a {want} literal, got {v!r}")
                return False
        if self.where is not None and not self.where(v):
            if st.explain:
                return st.miss(lambda: f"predicate {_fn_name(self.where)} is false for {v!r}")
            return False
        if self._shared:
            hit = self._memo_hit(v, st, k)
            if hit is not None:
                return hit
        return self._bind(v, st, k)

    def __repr__(self) -> str:
        return f"const({self.name or ''})"


class Seq(Pattern):
    """A list or tuple argument whose elements are patterns (e.g. ``cat([a, b])``)."""

    __slots__ = ("items",)

    def __init__(self, items: Iterable[Any], location: str | None = None) -> None:
        super().__init__(None, location or "")
        self.items = [_as_pattern(i) for i in items]

    def children(self):
        return self.items

    def _m(self, v, st, k):
        if not isinstance(v, (list, tuple)) or len(v) != len(self.items):
            if st.explain:
                return st.miss(lambda: f"expected a sequence of {len(self.items)}, got {_show(v)}")
            return False
        return _chain(self.items, list(v), 0, st, k)

    def __repr__(self) -> str:
        return "[" + ", ".join(map(repr, self.items)) + "]"


class AnyOf(Pattern):
    """Alternatives, tried in order; a later one is tried when the rest of the match fails."""

    __slots__ = ("options",)

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

    def _m(self, v, st, k):
        if self._shared:
            hit = self._memo_hit(v, st, k)
            if hit is not None:
                return hit
        then = k if self.name is None and not self._shared else lambda: self._bind(v, st, k)
        return any(o._m(v, st, then) for o in self.options)

    def __repr__(self) -> str:
        return "(" + " | ".join(map(repr, self.options)) + ")"


# ----- seeing through ops that keep the values ----------------------------------------------
_MAX_CHAIN = 16  # a longer run of views between two ops is no spelling anyone writes


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
        if self.casts and _is_noop_cast(v):
            return src
        if self.views and keeps_rows(v):
            return src
        return None

    def _m(self, v, st, k):
        if self._shared:
            hit = self._memo_hit(v, st, k)
            if hit is not None:
                return hit
        then = k if self.name is None and not self._shared else lambda: self._bind(v, st, k)
        inner = self.inner
        chain: list[Node] = []
        cur = v
        while True:
            if not chain:
                if inner._m(cur, st, then):
                    return True
            else:
                st.chains.append(tuple(reversed(chain)))  # innermost first
                if inner._m(cur, st, then):
                    return True
                st.chains.pop()
            nxt = self.step(cur)
            if nxt is None or len(chain) >= _MAX_CHAIN:
                return False
            chain.append(cur)
            cur = nxt

    def __repr__(self) -> str:
        what = "+".join(w for w, on in (("views", self.views), ("casts", self.casts)) if on)
        text = f"through[{what}]({self.inner!r})"
        return f"{text}.named({self.name!r})" if self.name else text


def _is_noop_cast(node: Node) -> bool:
    """A cast (any spelling) whose result has its input's dtype, shape and device."""
    if node.op == "call_function":
        t = node.target
        if t not in CAST_OPS and aten_op(t) not in CAST_OPS:
            return False
    elif node.target not in CAST_OPS:
        return False
    out, src = value_of(node), value_of(node.args[0])
    if not isinstance(out, torch.Tensor) or not isinstance(src, torch.Tensor):
        return False
    return out.dtype == src.dtype and out.shape == src.shape and out.device == src.device


class Scalar(Pattern):
    """A number: a literal, or a one-element constant tensor standing for one (ExecuTorch's
    Edge programs lift ``x + 1e-6`` into ``x + _lifted_tensor_constant``). Binds the number."""

    __slots__ = ("types",)

    def __init__(self, name=None, types=None, *, location=None) -> None:
        super().__init__(name, location)
        if isinstance(types, type):
            types = (types,)
        self.types = tuple(types) if types else (int, float)

    def _m(self, v, st, k):
        number = _constant_number(v) if v.__class__ is Node else v
        types = self.types
        ok = isinstance(number, types) and not (
            type(number) is bool and bool not in types and int in types
        )
        if not ok:
            if st.explain:
                want = "/".join(t.__name__ for t in types)
                msg = f"expected a {want} (a literal or a one-element constant), got {_show(v)}"
                return st.miss(lambda: msg, v)
            return False
        if self._shared:
            hit = self._memo_hit(number, st, k)
            if hit is not None:
                return hit
        return self._bind(number, st, k)

    def __repr__(self) -> str:
        return f"scalar({self.name or ''})"


def _constant_number(node: Node) -> Any:
    """The number a lifted one-element constant (placeholder or attribute) holds, else None.

    Export keeps the value of constants it lifts on their fake tensors (``.constant``);
    a value nobody writes in place is the same number every run."""
    if node.op not in ("placeholder", "get_attr"):
        return None
    val = value_of(node)
    const = getattr(val, "constant", None)
    if not isinstance(const, torch.Tensor) or const.numel() != 1:
        return None
    for user in node.users:
        target = aten_op(user.target)
        if isinstance(target, _OpOverload) and any(
            a.alias_info is not None and a.alias_info.is_write for a in target._schema.arguments
        ):
            return None  # written in place: not a constant
    return const.item()


# ----- op patterns ------------------------------------------------------------------------
class _Resolved:
    """An op pattern's arguments resolved against one target's schema.

    ``getter(args, kwargs)`` (generated code) returns the node's value for every argument
    the pattern mentions, in ``slots`` order; the first two are the first two positional
    parameters when the pattern is commutative.
    """

    __slots__ = (
        "child_slot",
        "free",
        "getter",
        "kw_names",
        "lits",
        "ok",
        "pos_limit",
        "quick",
        "slots",
        "subs",
        "swap",
        "unmentioned",
    )

    def __init__(self) -> None:
        self.slots: list[tuple] = []  # (index, name, default, pattern)
        self.lits: list[tuple] = []  # (slot, literal)
        self.subs: list[tuple] = []  # (slot, pattern), op patterns first
        self.quick: list[tuple] = []  # (slot, first-op keys, packets) checked up front
        self.unmentioned: list[tuple] = []  # (index, name, default) that must equal default
        self.pos_limit = -1  # schema-less targets: the positional args the pattern gives
        self.kw_names: frozenset[str] = frozenset()  # schema-less: the kwargs it gives
        self.free = False  # schema-less: the node may have more arguments
        self.swap: tuple[int, int] | None = None  # slots of positional 0 and 1
        self.ok = True
        self.getter: Callable[[tuple, dict], list] = lambda a, kw: []
        self.child_slot: list[int] = []  # for each pattern argument, its slot

    def finish(self) -> None:
        slots = self.slots
        where = {s[0]: i for i, s in enumerate(slots) if s[0] >= 0}
        if 0 in where and 1 in where:
            self.swap = (where[0], where[1])
        subs = []
        for i, (_, _, _, p) in enumerate(slots):
            if isinstance(p, Lit):
                self.lits.append((i, p.value))
            elif not (isinstance(p, Var) and p.free):
                subs.append((i, p))
        subs.sort(key=lambda s: _rank(s[1]))  # op patterns fail fastest: try them first
        self.subs = subs
        for i, p in subs:
            keys = first_keys(p)
            if keys is not None:
                self.quick.append((i, keys[0], keys[1]))
        self.getter = _make_getter(slots)


def _make_getter(slots: list[tuple]) -> Callable[[tuple, dict], list]:
    """Generated code fetching each slot's value from a node's args and kwargs."""
    env: dict[str, Any] = {}
    parts = []
    for j, (index, name, default, _) in enumerate(slots):
        env[f"d{j}"] = default
        if index >= 0 and name is not None:
            parts.append(f"a[{index}] if n > {index} else kw.get({name!r}, d{j})")
        elif index >= 0:
            parts.append(f"a[{index}] if n > {index} else d{j}")
        else:
            parts.append(f"kw.get({name!r}, d{j})")
    src = "def getter(a, kw):\n    n = len(a)\n    return [" + ", ".join(parts) + "]\n"
    exec(compile(src, "<fxpass pattern arguments>", "exec"), env)
    return env["getter"]


def _rank(p: Pattern) -> int:
    if isinstance(p, P):
        return 0
    if isinstance(p, (AnyOf, Seq)):
        return 1
    return 2


def first_keys(p: Pattern) -> tuple[frozenset, bool] | None:
    """Keys of the ops a pattern's top node can call (ids for functions), and whether any is
    an op packet; None when it can match anything (a variable among its alternatives)."""
    if isinstance(p, P):
        keys = {id(f) for f in p.fns} | {id(f) for f in p.packets}
        keys |= {("method", m) for m in p.methods} | {("module", m) for m in p.modules}
        return frozenset(keys), bool(p.packets)
    if isinstance(p, AnyOf):
        keys, packets = set(), False
        for o in p.options:
            sub = first_keys(o)
            if sub is None:
                return None
            keys |= sub[0]
            packets |= sub[1]
        return frozenset(keys), packets
    return None


def _quick(r: _Resolved, vals: list) -> bool:
    """A cheap look one level down: each op-pattern argument is a node calling a right op."""
    for i, keys, packets in r.quick:
        x = vals[i]
        if x.__class__ is not Node:
            return False
        op = x.op
        if op == "call_function":
            t = x.target
            if id(t) not in keys and not (
                packets and id(getattr(t, "overloadpacket", None)) in keys
            ):
                a = aten_op(t)  # an Edge spelling?
                if a is t or not (
                    id(a) in keys or (packets and id(getattr(a, "overloadpacket", None)) in keys)
                ):
                    return False
        elif (op[5:], x.target) not in keys:
            return False
    return True


def _run(subs: list[tuple], vals: list, st: MatchState, k: Callable[[], bool]) -> bool:
    """Match ``subs`` against their slot values, then ``k`` (continuation-passing)."""
    n = len(subs)
    if n == 0:
        return k()
    i0, p0 = subs[0]
    if n == 1:
        return p0._m(vals[i0], st, k)
    i1, p1 = subs[1]
    if n == 2:
        return p0._m(vals[i0], st, lambda: p1._m(vals[i1], st, k))
    return p0._m(vals[i0], st, lambda: _run(subs[1:], vals, st, k))


def _chain(pats: list, vals: list, i: int, st: MatchState, k: Callable[[], bool]) -> bool:
    last = len(pats) - 1
    if i > last:
        return k()
    if i == last:
        return pats[i]._m(vals[i], st, k)
    return pats[i]._m(vals[i], st, lambda: _chain(pats, vals, i + 1, st, k))


class P(Pattern):
    """A node calling one of a set of ops, with argument patterns. See the module docstring."""

    __slots__ = (
        "_cache",
        "_keep",
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

    def __init__(self, op: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(None, caller_location())
        ops = op if isinstance(op, (set, frozenset, list, tuple)) else [op]
        fns, packets, methods, modules = set(), set(), set(), set()
        for o in ops:
            if is_edge_op(o):  # an Edge op is its ATen op: the pattern matches both spellings
                o = aten_op(o)
            if isinstance(o, str):
                methods.add(o)
            elif isinstance(o, _OpOverloadPacket):
                packets.add(o)
            elif isinstance(o, _Module):
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
            len(self.args) >= 2 and bool(everything) and all(o in _SYMMETRIC for o in everything)
        )
        self.constraint: Constraint | None = None
        self.label: str | None = None  # a short name for the op set in messages
        self.one_spelling = False  # True: only these targets, not their Edge spellings
        self._cache: dict[int, _Resolved] = {}
        self._keep: list[Any] = []
        for f in fns:
            if isinstance(f, _OpOverload):
                self._resolve(f, eager=True)

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
        p = P(_Module(target), *args, **kwargs)
        p.location = caller_location()
        return p

    @staticmethod
    def exact(op: Any, *args: Any, **kwargs: Any) -> P:
        """``op(*args, **kwargs)`` compared as torch's matcher compares nodes: the target is
        ``op`` itself (an op packet matches only nodes calling the packet, not its
        overloads) and the operands are in the given order (no commutative swap)."""
        p = P(op, *args, **kwargs)
        if isinstance(op, _OpOverloadPacket) or is_edge_op(op):
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
        c.constraint = Constraint(dtype=dtype, where=_is_pure_cast)
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

    def ops(self) -> list[Any]:
        return [*self.fns, *self.packets, *self.methods, *(_Module(m) for m in self.modules)]

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

    # ----- matching ---------------------------------------------------------------------
    def _op_ok(self, v: Node) -> bool:
        op = v.op
        if op == "call_function":
            t = v.target
            if id(t) in self.fn_ids:
                return True
            if self.packets and getattr(t, "overloadpacket", None) in self.packets:
                return True
            if self.one_spelling:
                return False
            a = aten_op(t)  # an Edge (or dim-order) spelling of an op in the set
            if a is t:
                return False
            if id(a) in self.fn_ids or getattr(a, "overloadpacket", None) in self.packets:
                self.fn_ids = self.fn_ids | {id(t)}  # the next look-up is one set probe
                self._keep.append(t)
                return True
            return False
        if op == "call_method":
            return v.target in self.methods
        if op == "call_module":
            return v.target in self.modules
        return False

    def _resolve(self, target: Any, eager: bool = False) -> _Resolved:
        """The argument layout for ``target`` (a call_function target, or an op name)."""
        key = id(target)
        r = self._cache.get(key)
        if r is not None:
            return r
        r = _Resolved()
        spelled = isinstance(target, _OpOverload) or aten_op(target) is not target
        schema = getattr(target, "_schema", None) if spelled else None
        if schema is not None:
            self._resolve_schema(r, schema, target, eager)
        else:
            for i, p in enumerate(self.args):
                r.slots.append((i, None, MISSING, p))
            for name, p in self.kwargs.items():
                r.slots.append((-1, name, MISSING, p))
            r.pos_limit = len(self.args)
            r.kw_names = frozenset(self.kwargs)
            r.free = self.free_rest
        if r.ok:
            r.finish()
            used: set[int] = set()
            for child in self.children():
                i = next(i for i, sl in enumerate(r.slots) if sl[3] is child and i not in used)
                used.add(i)
                r.child_slot.append(i)
        self._cache[key] = r
        self._keep.append(target)  # keeps the id valid while cached
        return r

    def _resolve_schema(self, r: _Resolved, schema: Any, target: Any, eager: bool) -> None:
        params = schema.arguments
        positional = [a for a in params if not a.kwarg_only]
        if len(self.args) > len(positional):
            if eager:
                raise TypeError(
                    f"pattern {target} gets {len(self.args)} positional arguments, but the op "
                    f"takes at most {len(positional)} ({schema})"
                )
            r.ok = False
            return
        given = {}
        for i, p in enumerate(self.args):
            given[positional[i].name] = p
        for key, p in self.kwargs.items():
            if key in given or not any(a.name == key for a in params):
                if eager:
                    raise TypeError(f"pattern {target} has no argument '{key}' ({schema})")
                r.ok = False
                return
            given[key] = p
        for idx, a in enumerate(params):
            index = -1 if a.kwarg_only else idx
            default = a.default_value if a.has_default_value() else MISSING
            if a.name in given:
                r.slots.append((index, a.name, default, given[a.name]))
            elif self.free_rest:
                continue
            elif default is MISSING:
                if eager:
                    raise TypeError(
                        f"pattern {target} gives no value for its required argument "
                        f"'{a.name}'; add it, or end the arguments with '...' to leave "
                        f"the rest free ({schema})"
                    )
                r.ok = False
                return
            else:
                r.unmentioned.append((index, a.name, default))

    def _m(self, v, st, k):
        if v.__class__ is not Node:
            if st.explain:
                return st.miss(
                    lambda: f"expected a node calling {self.describe_ops()}, got {v!r}", None
                )
            return False
        op = v.op
        if op == "call_function":
            t = v.target
            r = self._cache.get(id(t))
            if r is None or id(t) not in self.fn_ids:
                r = self._resolve(t) if self._op_ok(v) else None
        elif op == "call_method" or op == "call_module":
            r = self._resolve(op) if self._op_ok(v) else None
        else:
            r = None
        if r is None:
            if st.name_match and st.name_match in v.name:
                r = self._resolve(v.target if op == "call_function" else op)
            elif st.explain:
                return st.miss(lambda: _wrong_op(self, v), v)
            else:
                return False
        if self._shared:
            hit = self._memo_hit(v, st, k)
            if hit is not None:
                return hit
        if st.injective and v in st.used:
            if st.explain:
                return st.miss(lambda: f"{_show(v)} is already matched elsewhere", v)
            return False
        c = self.constraint
        if c is not None:
            why = c.failure(v, v)
            if why is not None:
                return st.miss(lambda: why, v) if st.explain else False
        if not r.ok:
            if st.explain:
                return st.miss(lambda: f"{_show(v)}: the pattern's arguments do not fit", v)
            return False
        args, kwargs = v.args, v.kwargs
        if (r.unmentioned or r.pos_limit >= 0) and not _strict_ok(r, args, kwargs, v, st):
            return False
        vals = r.getter(args, kwargs)
        thorough = st.explain or st.name_match
        straight = thorough or not r.quick or _quick(r, vals)
        svals = None
        if self.commutative and r.swap is not None:
            i, j = r.swap
            svals = list(vals)
            svals[i], svals[j] = vals[j], vals[i]
            if not (thorough or not r.quick or _quick(r, svals)):
                svals = None
        if not straight and svals is None:
            return False
        st.nodes.append(v)
        if st.injective:
            st.used[v] = self
        then = k if self.name is None and not self._shared else lambda: self._bind(v, st, k)
        if straight and _args(r, vals, st, then):
            return True
        if svals is not None and _args(r, svals, st, then):
            return True
        st.nodes.pop()
        if st.injective:
            del st.used[v]
        return False


def _strict_ok(r: _Resolved, args: tuple, kwargs: dict, v: Node, st: MatchState) -> bool:
    """Arguments the pattern leaves out must be defaults (with a schema); without a schema
    the node has exactly the arguments the pattern gives (at least them, after ``...``)."""
    for index, name, default in r.unmentioned:
        val = args[index] if 0 <= index < len(args) else kwargs.get(name, default)
        if not (val is default or lit_ok(default, val, st)):
            if st.explain:
                msg = (
                    f"{_show(v)}: argument '{name}' is {_show(val)}; the pattern "
                    f"leaves it out, so it must be its default {default!r}"
                )
                return st.miss(lambda msg=msg: msg, v)
            return False
    if r.pos_limit >= 0:
        n, names = len(args), r.kw_names
        if r.free:
            ok = n >= r.pos_limit and all(key in kwargs for key in names)
        else:
            ok = n == r.pos_limit and len(kwargs) == len(names) and all(k in names for k in kwargs)
        if not ok:
            if st.explain:
                return st.miss(
                    lambda: (
                        f"{_show(v)} has other arguments than the pattern ({len(args)} "
                        f"positional, keywords {sorted(kwargs)}; the pattern gives "
                        f"{r.pos_limit} and {sorted(names)})"
                    ),
                    v,
                )
            return False
    return True


def _args(r: _Resolved, vals: list, st: MatchState, k: Callable[[], bool]) -> bool:
    for i, lit in r.lits:
        val = vals[i]
        if lit is not val and not lit_ok(lit, val, st):
            if st.explain:
                index, name = r.slots[i][0], r.slots[i][1]
                msg = (
                    f"literal differs: argument '{name or f'#{index}'}' of "
                    f"{_show(st.nodes[-1])} is {_show(val)}, expected {lit!r}"
                )
                return st.miss(lambda msg=msg: msg, st.nodes[-1])
            return False
    return _run(r.subs, vals, st, k)


class _Module:
    """Marks a ``call_module`` target in an op set (see :meth:`P.module`)."""

    __slots__ = ("target",)

    def __init__(self, target: str) -> None:
        self.target = target


def _wrong_op(p: P, v: Node) -> str:
    if v.op in ("call_function", "call_method", "call_module"):
        have = op_name(v.target) if v.op != "call_module" else f"module {v.target}"
    else:
        have = f"a {v.op}"
    return f"wrong op: expected {p.describe_ops()}, got {have} (%{v.name})"


def _is_pure_cast(node: Node) -> bool:
    """A cast changes only the dtype: same shape and device as its input (when known)."""
    out = value_of(node)
    src = value_of(node.args[0]) if node.args else MISSING
    if out is MISSING or src is MISSING or not isinstance(out, torch.Tensor):
        return True
    if not isinstance(src, torch.Tensor):
        return False
    return out.shape == src.shape and out.device == src.device


def mark_shared(roots: Iterable[Pattern]) -> None:
    """Flag every pattern object used more than once (a DAG), so all uses bind one node."""
    counts: dict[int, int] = {}
    objs: dict[int, Pattern] = {}
    stack = list(roots)
    while stack:
        p = stack.pop()
        counts[id(p)] = counts.get(id(p), 0) + 1
        if counts[id(p)] == 1:
            objs[id(p)] = p
            stack.extend(p.children())
    for key, n in counts.items():
        p = objs[key]
        if n > 1 and not isinstance(p, Lit):
            p._shared = True
