"""Metadata for the nodes a rewrite creates: values, source locations and provenance.

Every new node gets

* ``meta['val']``: its op run on its inputs' fake values by fxpass's one fake-value
  evaluator (:class:`~fxpass.fxutil.values.FakeEvaluator`, lenient: a node whose op has no
  fake kernel gets no value, which the metadata check names). Layer-stacked models repeat
  the same replacement with the same shapes hundreds of times, so the evaluator's results are
  remembered by (op, input metadata) for the process; where a remembered result is used, the
  value of the node being replaced stands in for a fresh fake tensor when it has exactly the
  result's metadata. Results on symbolic sizes (a graph with a dynamic dimension) are
  remembered per fake mode the same way (:mod:`._symbolic_results`).
* ``stack_trace``, ``nn_module_stack`` (and ``source_fn_stack``, ``torch_fn``) of the node
  it replaces, or of the match's root;
* ``from_node``: torch's provenance list (:class:`torch.fx.traceback.NodeSource`, one per
  replaced node, action ``replace``), as torch's own passes record it;
* ``fxpass_provenance``: ``{"rule", "pass", "replaced", "location"}``.

A rewrite that changes existing values (a weight sliced, a size argument rewritten) calls
:func:`repropagate` once at its end: every value downstream of a change is computed again.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch.fx import Node
from torch.fx.node import map_arg

from ..edit.provenance import COPIED_META, node_sources, provenance_record
from ..fxutil.fx_internals import node_args, node_kwargs
from ..fxutil.paths import find_path
from ..fxutil.values import FakeEvaluator, Strictness, fake_value, node_val
from ._symbolic_results import SYMBOLIC_RESULTS

__all__ = ["MetaPropagator", "fake_mode", "repropagate"]


_NO = object()


class MetaPropagator:
    """Fills in the metadata of new nodes; one per rewrite run.

    ``mode``: the fake tensor mode the values live in; by default the mode of the graph's
    input values, found at the first node that needs one.
    """

    def __init__(self, mode: Any = None) -> None:
        self._evaluator: FakeEvaluator | None = None
        if mode is not None:
            self._evaluator = self._lenient(mode)

    @staticmethod
    def _lenient(mode: Any) -> FakeEvaluator:
        return FakeEvaluator(mode, strictness=Strictness.LENIENT, owner="rewrite")

    def evaluator(self, graph: Any) -> FakeEvaluator:
        """The evaluator of this run, in the fake mode of ``graph``'s values."""
        if self._evaluator is None:
            self._evaluator = FakeEvaluator.for_graph(
                graph, strictness=Strictness.LENIENT, owner="rewrite"
            )
        return self._evaluator

    # ----- values -----------------------------------------------------------------------
    def values(
        self,
        new: Sequence[Node],
        donors: Mapping[Node, Node],
        fallback: Node,
        *,
        known: Mapping[Node, Any] | None = None,
    ) -> None:
        """Set ``meta['val']`` on ``new`` (in graph order); ``donors`` maps a new node to
        the old node whose uses it takes over. ``known``: values the replacement knows
        exactly (:meth:`~fxpass.rewrite.GraphReplacement.known_values`), taken as they are
        where computing them would run without autograd, as they were computed."""
        dynamo = "val" not in fallback.meta and "example_value" in fallback.meta
        # values follow the graph's convention, which the replaced node shows: export and
        # AOT record values computed without autograd, Dynamo with it
        grad = _requires_grad(node_val(fallback))
        if grad or not known:
            known = None
        with torch.set_grad_enabled(grad):
            for n in new:
                self._set_value(n, donors, dynamo, known)

    def _set_value(
        self, n: Node, donors: Mapping[Node, Node], dynamo: bool, known: Mapping[Node, Any] | None
    ) -> None:
        val = known.get(n) if known is not None else None
        if val is not None and _requires_grad(val):
            val = None
        if val is None:
            val = self._value(n, donors)
        if val is None:
            old = donors.get(n)
            if old is not None:
                val = node_val(old)  # the same value by construction of the rewrite
        if val is not None:
            n.meta["val"] = val
            if dynamo:  # Dynamo's backends read example_value
                n.meta["example_value"] = val

    def _value(self, n: Node, donors: Mapping[Node, Node]) -> Any:
        args = node_args(n)
        if n.target is operator.getitem and args and isinstance(args[0], Node):
            src = node_val(args[0])
            if isinstance(src, (tuple, list)):
                try:
                    return src[args[1]]
                except (IndexError, KeyError, TypeError):
                    return None
        if n.op == "get_attr":  # a constant the replacement made: its value, made fake
            owner = n.graph.owning_module
            value = find_path(owner, str(n.target)) if owner is not None else None
            if not isinstance(value, torch.Tensor):
                return None
            return self.evaluator(n.graph).fake(value)
        if n.op not in ("call_function", "call_method"):
            return None
        kwargs = node_kwargs(n)
        prefer = _donor_values(n, donors) if donors else None
        evaluator = self.evaluator(n.graph)

        def compute() -> Any:
            return evaluator.run_on_nodes(n.target, args, kwargs, kind=n.op, node=n, prefer=prefer)

        if n.op != "call_function":
            return compute()
        missing: list[Node] = []

        def val(a: Node) -> Any:
            v = node_val(a)
            if v is None:
                missing.append(a)
            return v

        values = map_arg((args, kwargs), val)
        if missing:  # the evaluator says which
            return compute()

        def run() -> Any:  # on the values just read, without reading them again
            return evaluator.run(n.target, values[0], values[1], node=n, prefer=prefer)

        return SYMBOLIC_RESULTS.call(n.target, values[0], values[1], run, prefer=prefer)

    # ----- provenance -------------------------------------------------------------------
    @staticmethod
    def provenance(
        new: Sequence[Node],
        donors: Mapping[Node, Node],
        root: Node,
        replaced: Sequence[Node],
        *,
        outputs: Sequence[Node] = (),
        rule: str,
        pass_name: str,
        location: str,
    ) -> None:
        """Copy source metadata and record provenance on every new node.

        As torch's own rewrites record it, ``from_node`` names the node a new node takes
        over from (``replace``); a new node that takes over no single node (a fused op
        feeding several outputs) names all the outputs. ``fxpass_provenance['replaced']``
        lists every node the rewrite removed.
        """
        outs = list(outputs) or [root]
        sources = dict(zip(outs, node_sources(outs, pass_name)))
        every = list(sources.values())
        names = [n.name for n in replaced]
        root_meta = root.meta
        for n in new:
            donor = donors.get(n)
            src_meta = donor.meta if donor is not None else root_meta
            meta = n.meta
            for key in COPIED_META:
                value = src_meta.get(key, _NO)
                if value is _NO:
                    value = root_meta.get(key, _NO)
                if value is not _NO:
                    meta[key] = value
                elif key in meta:
                    del meta[key]
            src = sources.get(donor) if donor is not None else None
            meta["from_node"] = [src] if src is not None else list(every)
            meta["fxpass_provenance"] = provenance_record(rule, pass_name, names, location)


def _requires_grad(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return value.requires_grad
    return isinstance(value, (tuple, list)) and any(_requires_grad(v) for v in value)


def _donor_values(n: Node, donors: Mapping[Node, Node]) -> Any:
    """The values of the old nodes ``n`` takes over: its donor's, or for a tuple-valued node
    one per element, from the getitem users that have donors (None where none does)."""
    old = donors.get(n)
    if old is not None:
        return node_val(old)
    by_index: dict[int, Any] = {}
    for u in n.users:
        if u.target is operator.getitem and len(u.args) > 1 and u in donors:
            index = u.args[1]
            if isinstance(index, int) and index >= 0:
                by_index[index] = node_val(donors[u])
    if not by_index:
        return None
    return tuple(by_index.get(i) for i in range(max(by_index) + 1))


def fake_mode(gm: torch.fx.GraphModule) -> Any:
    """The fake mode of the graph's placeholders (a new one when they have none)."""
    from torch._guards import detect_fake_mode
    from torch._subclasses.fake_tensor import FakeTensorMode

    vals = [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]
    mode = detect_fake_mode([v for v in vals if isinstance(v, torch.Tensor)])
    return mode or FakeTensorMode(allow_non_fake_inputs=True)


def _spec(val: Any) -> Any:
    if isinstance(val, torch.Tensor):
        return (tuple(val.shape), tuple(val.stride()), val.dtype)
    if isinstance(val, (list, tuple)):
        return tuple(_spec(v) for v in val)
    return val


def repropagate(gm: torch.fx.GraphModule, mode: Any, changed: set[Node] | None = None) -> None:
    """Recompute ``meta['val']`` where it may be stale: nodes without one, and every node
    downstream of a value whose metadata changed (``changed``: the weights sliced). Results
    are cached by op and input metadata, so a model's repeated layers cost one layer."""
    prop = MetaPropagator(mode)
    changed = set(changed or ())
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        stale = "val" not in node.meta or any(a in changed for a in node.all_input_nodes)
        if not stale:
            continue
        old = node.meta.pop("val", None)
        prop.values([node], {}, node)
        if "val" not in node.meta:  # the cache and the fake kernel could not say: be strict
            node.meta["val"] = fake_value(node.target, node.args, node.kwargs, mode=mode,
                                          strict=True)  # fmt: skip
        if old is None or _spec(old) != _spec(node.meta["val"]):
            changed.add(node)
