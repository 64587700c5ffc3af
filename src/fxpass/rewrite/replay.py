"""Recorded replacements: a rule's replacement run once per kind of match, then copied.

A fusion rewrites the same site of every layer of a model: the same ops on values of the
same sizes, strides and dtypes, with the same literals. A rule whose replacement depends on
nothing else (``Rule(..., replay=True)``: it reads the bound values' metadata, never their
nodes' names, users or other metadata, and has no ``match`` parameter) is run once per
*signature* — the metadata of each value it is given (:func:`~fxpass.fxutil.value_keys.
tensor_key`), each literal, which names are bound to one node, and the grad mode the values
were made in — and the nodes it made are recorded: their ops, their arguments (a bound name,
an earlier new node, or a literal), which of them replace the outputs, and the metadata of
each one's value. A later match with the same signature gets copies of those nodes, made
through the editor, without the replacement's proxies, its fake-kernel calls or the
fake-value computation of the new nodes.

The values are what the rewriter's metadata computes (:class:`~fxpass.rewrite.metadata.
MetaPropagator`): where the op's fake result is remembered for its inputs' metadata (the
process's :data:`~fxpass.fxutil.values.FAKE_RESULTS`), a fresh fake tensor with that
metadata, or the replaced node's value where it has exactly that metadata. A recording is
made only where that is what every new node got: ops that alias an input, results that
require grad, constants the replacement made (``get_attr`` nodes), metadata the
replacement wrote itself, and Edge graphs (their ops are respelled) are left to the
replacement at every match.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch.fx import Node
from torch.fx.node import map_aggregate

from ..edit.editor import Editor
from ..fxutil.value_keys import build_result, result_spec, tensor_key
from ..fxutil.values import node_val, returns_alias
from .metadata import _donor_values, _requires_grad

__all__ = ["Recorded", "Recordings"]

#: Literals a recorded node's arguments may hold (copied as they are).
_LITERALS = (
    int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout,
    torch.memory_format,
)  # fmt: skip


class _NotRecordable(Exception):
    pass


def signature(bindings: Mapping[str, Any], names: Sequence[str], root: Node) -> tuple | None:
    """The key of a match for its rule's recordings: per name the replacement takes, the
    metadata of a bound node's value or the bound literal, and the first name bound to the
    same node; None where a value has no key (symbolic sizes, a list of nodes...)."""
    parts: list[Any] = [_requires_grad(node_val(root))]
    first: dict[Node, str] = {}
    for name in names:
        v = bindings.get(name, _ABSENT)
        if v.__class__ is Node:
            key = tensor_key(node_val(v))
            if key is None:
                return None
            parts.append((name, first.setdefault(v, name), key))
        elif v is _ABSENT:
            parts.append((name,))
        elif type(v) in _LITERALS:
            parts.append((name, type(v), v))
        else:
            return None
    return tuple(parts)


_ABSENT: Any = object()


class Recorded:
    """The nodes one replacement made for one signature (see the module)."""

    __slots__ = ("outputs", "steps")

    def __init__(self, steps: list[tuple], outputs: list[tuple[str, Any]]) -> None:
        # steps: (op, target, args, kwargs, value) with arguments as ("b", name) /
        # ("n", index) markers; value ("spec", spec) | ("item", index of a new node, i)
        self.steps = steps
        self.outputs = outputs  # ("n", index) or ("b", name) per output

    @classmethod
    def of(
        cls, new: Sequence[Node], values: Sequence[Node], bindings: Mapping[str, Any]
    ) -> Recorded | None:
        """The recording of a replacement that made ``new`` (their values set) and returned
        ``values``; None where it cannot be copied (see the module)."""
        index = {n: i for i, n in enumerate(new)}
        bound: dict[Node, str] = {}
        for name, v in bindings.items():
            if v.__class__ is Node:
                bound.setdefault(v, name)

        def mark(a: Any) -> Any:
            if a.__class__ is Node:
                if a in index:
                    return _Ref("n", index[a])
                if a in bound:
                    return _Ref("b", bound[a])
                raise _NotRecordable
            if isinstance(a, (tuple, list)) or type(a) in _LITERALS:
                return a
            if isinstance(a, slice):
                return a
            raise _NotRecordable

        steps = []
        try:
            for n in new:
                if n.op != "call_function" or n.type is not None:
                    return None
                if set(n.meta) - {"val"}:  # the replacement wrote metadata of its own
                    return None
                val = node_val(n)
                args = map_aggregate(n.args, mark)
                kwargs = map_aggregate(dict(n.kwargs), mark)
                if n.target is operator.getitem and n.args and n.args[0] in index:
                    src, i = n.args[0], n.args[1] if len(n.args) > 1 else None
                    item = node_val(src)
                    if not isinstance(i, int) or not isinstance(item, (tuple, list)):
                        return None
                    if i >= len(item) or item[i] is not val:
                        return None
                    value: tuple = ("item", index[src], i)
                else:
                    if returns_alias(n.target):
                        return None  # the fake results are never remembered for these
                    spec = result_spec(val)
                    if spec is None:
                        return None
                    value = ("spec", spec)
                steps.append((n.target, args, kwargs, value))
            outputs = []
            for v in values:
                m = mark(v)
                outputs.append((m.kind, m.at))
        except _NotRecordable:
            return None
        return cls(steps, outputs)

    def write(
        self,
        graph: Any,
        bindings: Mapping[str, Any],
        editor: Editor,
        donors_of: Any,
        mode: Any,
    ) -> tuple[list[Node], list[Node]]:
        """Copies of the recorded nodes at ``graph``'s insertion point, reading ``bindings``,
        with their values; (the new nodes, the values per output). ``donors_of(values)``
        maps the new nodes to the outputs they replace (what :meth:`MetaPropagator.values`
        prefers)."""
        made: list[Node] = []

        def arg(a: Any) -> Any:
            if a.__class__ is _Ref:
                return made[a.at] if a.kind == "n" else bindings[a.at]
            return a

        for target, args, kwargs, _ in self.steps:
            args, kwargs = map_aggregate(args, arg), map_aggregate(kwargs, arg)
            made.append(editor.create(graph, "call_function", target, args, kwargs))
        values = [made[at] if kind == "n" else bindings[at] for kind, at in self.outputs]
        donors = donors_of(values)
        for n, (_, _, _, value) in zip(made, self.steps):
            if value[0] == "item":
                val = node_val(made[value[1]])[value[2]]
            else:
                val = build_result(value[1], mode, _donor_values(n, donors))
            n.meta["val"] = val
        return made, values


class _Ref:
    """An argument of a recorded node: a bound name (``"b"``) or an earlier new node
    (``"n"``, its index)."""

    __slots__ = ("at", "kind")

    def __init__(self, kind: str, at: Any) -> None:
        self.kind, self.at = kind, at


class Recordings:
    """A rule's recordings by signature (bounded: the oldest half goes when full)."""

    LIMIT = 64

    def __init__(self) -> None:
        self._by_key: dict[tuple, Recorded | None] = {}

    def get(self, key: tuple) -> Any:
        """The recording (None: the replacement cannot be recorded), or ``ABSENT``."""
        return self._by_key.get(key, _ABSENT)

    def put(self, key: tuple, recorded: Recorded | None) -> None:
        table = self._by_key
        if len(table) >= self.LIMIT:
            for k in list(table)[: self.LIMIT // 2]:
                del table[k]
        table[key] = recorded


ABSENT = _ABSENT
