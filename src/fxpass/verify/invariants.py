"""Metadata invariants: what every node of a well-formed graph carries after a pass, and
what each pass promises to keep.

Backends read ``meta['val']`` for shapes and dtypes, and people debugging read
``stack_trace`` and ``nn_module_stack``; a pass that drops them breaks what runs after it.
:func:`check_metadata` lists the nodes that miss a key; :func:`require_metadata` makes a check
for :meth:`Pipeline.add_checks <fxpass.Pipeline.add_checks>`, so the pass that drops
metadata is the one named in the error.

A pass declares the metadata it keeps valid (``@fp.register(..., keeps=("val",
"stack_trace"))``, ``Pass.keeps``; the names are :data:`fxpass.core.contract.METADATA`).
:func:`keeps_metadata` is the check that holds each pass to its declaration: it looks at the
graph before and after every pass and names the pass and the node that broke a promise.

>>> pipe.add_checks(require_metadata("val"))           # doctest: +SKIP
>>> pipe.add_checks(keeps_metadata())                  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import fx

from ..fxutil.fx_internals import is_erased, node_args, node_kwargs
from ..fxutil.ops import schema_of
from ..fxutil.values import FakeEvaluator, Strictness, node_val
from ..ops.stream import is_stream_op
from .layouts import check_layouts

__all__ = [
    "MetadataContractError",
    "MetadataError",
    "check_metadata",
    "keeps_metadata",
    "require_metadata",
]

_OPS = ("call_function", "call_method", "call_module", "placeholder", "get_attr")


class MetadataError(AssertionError):
    """Nodes are missing metadata a pass should have kept or written."""


def check_metadata(
    gm: fx.GraphModule, keys: Iterable[str] = ("val",), *, ops: Iterable[str] = _OPS
) -> list[str]:
    """``"node: missing key"`` for each node of an op kind in ``ops`` without each of ``keys``.

    Provenance written by fxpass's rewrites (``meta['fxpass_provenance']``) must come with
    torch's ``meta['from_node']``; that is checked too.
    """
    keys, ops = tuple(keys), set(ops)
    problems = []
    for node in gm.graph.nodes:
        if node.op not in ops:
            continue
        missing = [k for k in keys if k not in node.meta and not (k == "val" and _no_value(node))]
        if "fxpass_provenance" in node.meta and not node.meta.get("from_node"):
            missing.append("from_node")
        if missing:
            problems.append(f"{node.name} ({node.op} {node.target}): missing {', '.join(missing)}")
    return problems


def _no_value(node: fx.Node) -> bool:
    """Ops that return nothing (``aten._assert_tensor_metadata``) have no value to describe."""
    schema = schema_of(node.target)
    return node.op == "call_function" and schema is not None and not schema.returns


def require_metadata(*keys: str, ops: Iterable[str] = _OPS) -> Callable[[fx.GraphModule], None]:
    """A pipeline check that raises :class:`MetadataError` when nodes miss ``keys``."""
    keys = keys or ("val",)

    def check(gm: fx.GraphModule) -> None:
        problems = check_metadata(gm, keys, ops=ops)
        if problems:
            more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
            raise MetadataError(
                f"{len(problems)} nodes miss metadata: {'; '.join(problems[:5])}{more}"
            )

    check.__name__ = f"require_metadata({', '.join(keys)})"
    return check


# ----- what each pass promises ------------------------------------------------------------------
class MetadataContractError(MetadataError):
    """A pass broke the metadata it declares it keeps (its ``keeps``)."""


_COMPUTE = ("call_function", "call_method", "call_module")
_SOURCE_KEYS = ("stack_trace", "nn_module_stack")
# the keys whose presence is compared before/after (provenance is torch's from_node)
_PRESENCE = {"val": "val", "stack_trace": "stack_trace", "nn_module_stack": "nn_module_stack",
             "provenance": "from_node", "stream": "stream"}  # fmt: skip


class _Before:
    """What a graph looked like before a pass: its nodes with their argument objects (a
    pass that rewires a node gives it new ones), who carried each kept key, and whether
    every compute node carried the source keys."""

    def __init__(self, graph: fx.Graph, keeps: frozenset[str]) -> None:
        self.keeps = keeps
        self.args = {n: (node_args(n), node_kwargs(n)) for n in graph.nodes}
        self.names = {n.name: n for n in self.args}
        keys = [_PRESENCE[k] for k in keeps if k in _PRESENCE]
        self.had = {key: {n for n in self.args if key in n.meta} for key in keys}
        compute = [n for n in self.args if n.op in _COMPUTE]
        self.everywhere = {
            key: bool(compute) and all(key in n.meta for n in compute) for key in _SOURCE_KEYS
        }
        self.streams = "stream" in keeps and any("stream" in n.meta for n in self.args)

    def problems(self, gm: fx.GraphModule) -> list[str]:
        graph = gm.graph
        new, touched = [], []
        for n in graph.nodes:
            was = self.args.get(n)
            if was is None:
                new.append(n)
            elif was[0] is not node_args(n) or was[1] is not node_kwargs(n):
                touched.append(n)
        out = []
        for key in sorted(self.keeps):
            out += [f"keeps {key}, but {p}" for p in self._key_problems(key, gm, new, touched)]
        return out

    def _key_problems(self, key: str, gm: fx.GraphModule, new: list, touched: list) -> list[str]:
        if key == "layouts":
            return check_layouts(gm, nodes=[*new, *touched])
        meta_key = _PRESENCE[key]
        out = [
            f"{_node(n)} lost meta['{meta_key}']"
            for n in self.had.get(meta_key, ())
            if meta_key not in n.meta and not is_erased(n)
        ]
        if key == "val":
            out += _val_problems(new, touched)
        elif key in _SOURCE_KEYS:
            for n in new:
                why = self._inherits(n, key) if n.op in _COMPUTE and key not in n.meta else None
                if why:
                    out.append(f"new node {_node(n)} has no meta['{key}'] ({why})")
        elif key == "provenance":
            out += [
                f"new node {_node(n)} has no meta['from_node']"
                for n in new
                if n.op not in ("placeholder", "output") and not n.meta.get("from_node")
            ]
        elif key == "stream" and self.streams:
            out += [
                f"new node {_node(n)} has no meta['stream'] in a graph with stream assignments"
                for n in new
                if n.op == "call_function" and "stream" not in n.meta and not is_stream_op(n)
            ]
        return out

    def _inherits(self, node: fx.Node, key: str) -> str | None:
        """Why a new node should carry a source key — a node it was made from (by its
        provenance) did, or, without provenance, every compute node did — or None."""
        origins = [self.names.get(name) for name in _origin_names(node)]
        origins = [o for o in origins if o is not None]
        if origins:
            made_from = [o for o in origins if key in o.meta]
            return f"%{made_from[0].name}, which it was made from, had one" if made_from else None
        return "every compute node had one" if self.everywhere[key] else None


def _origin_names(node: fx.Node) -> list[str]:
    prov = node.meta.get("fxpass_provenance")
    if isinstance(prov, dict) and prov.get("replaced"):
        return list(prov["replaced"])
    return [getattr(s, "name", None) for s in node.meta.get("from_node", ()) or ()]


def _node(n: fx.Node) -> str:
    return f"%{n.name} ({n.target})"


def _val_problems(new: list[fx.Node], touched: list[fx.Node]) -> list[str]:
    """New or rewired nodes without a value where their inputs have one, or whose value's
    shape or dtype is not what their op gives on their inputs' values."""
    evaluator = FakeEvaluator(strictness=Strictness.DECLINE, new_mode=False)
    out = []
    for n in [*new, *touched]:
        if n.op not in ("call_function", "call_method") or _no_value(n):
            continue
        if any(node_val(a) is None for a in n.all_input_nodes):
            continue  # nothing to compute it from: not this pass's doing
        recorded = node_val(n)
        if recorded is None:
            out.append(f"{'new' if n in new else 'rewired'} node {_node(n)} has no meta['val']")
            continue
        try:
            computed = evaluator.rerun(n)
        except Exception as e:  # broad: reported — among the problems, naming the node
            out.append(f"{_node(n)} no longer runs on its inputs' values ({type(e).__name__})")
            continue
        diff = _shape_difference(recorded, computed)
        if diff is not None:
            out.append(f"{_node(n)} records {diff[0]}, its op gives {diff[1]}")
    return out


def _shape_difference(recorded: Any, computed: Any) -> tuple[str, str] | None:
    if computed is None:
        return None
    if isinstance(recorded, torch.Tensor) and isinstance(computed, torch.Tensor):
        a = (tuple(recorded.shape), recorded.dtype)
        b = (tuple(computed.shape), computed.dtype)
        same = a[1] == b[1] and len(a[0]) == len(b[0])
        same = same and all(
            x == y for x, y in zip(a[0], b[0]) if isinstance(x, int) and isinstance(y, int)
        )
        return None if same else (_describe(a), _describe(b))
    if isinstance(recorded, (tuple, list)) and isinstance(computed, (tuple, list)):
        if len(recorded) != len(computed):
            return (f"{len(recorded)} values", f"{len(computed)}")
        for r, c in zip(recorded, computed):
            diff = _shape_difference(r, c)
            if diff is not None:
                return diff
    return None


def _describe(spec: tuple) -> str:
    return f"shape {list(spec[0])} {str(spec[1]).replace('torch.', '')}"


class _KeepsMetadata:
    """The check behind :func:`keeps_metadata` (the pipeline calls ``before_pass`` and
    ``after_pass`` around each pass; as a plain check it has nothing to say)."""

    __name__ = "keeps_metadata"

    def __call__(self, gm: fx.GraphModule) -> None:
        return None

    def before_pass(self, gm: fx.GraphModule, p: Any) -> _Before | None:
        keeps = getattr(p, "keeps", None)
        return _Before(gm.graph, frozenset(keeps)) if keeps else None

    def after_pass(self, gm: fx.GraphModule, p: Any, before: _Before | None, changed: bool):
        if before is None or not changed:
            return
        problems = before.problems(gm)
        if problems:
            more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
            raise MetadataContractError(f"pass '{p.name}' {'; '.join(problems[:5])}{more}")


def keeps_metadata() -> Callable[[fx.GraphModule], None]:
    """A pipeline check that holds each pass to the metadata it declares it keeps
    (``keeps=``): after a pass that changed the graph it compares the graph with the one the
    pass was given and raises :class:`MetadataContractError` naming the pass and the node.

    What each name promises (see :data:`fxpass.core.contract.METADATA`): ``val`` — nodes
    keep ``meta['val']``, and new or rewired nodes have one whose shape and dtype are what
    their op gives on their inputs' values; ``layouts`` — the strides too, and the users of
    those nodes still fit them (:func:`~fxpass.verify.check_layouts`); ``stack_trace``,
    ``nn_module_stack`` — nodes keep them, new nodes carry them when the nodes they were
    made from did; ``provenance`` — new nodes carry ``meta['from_node']``, nodes keep
    theirs; ``stream`` — in a graph with stream assignments, nodes keep ``meta['stream']``
    and new compute nodes get one. Passes that declare nothing are not checked.
    """
    return _KeepsMetadata()
