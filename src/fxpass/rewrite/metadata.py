"""Metadata for the nodes a rewrite creates: values, source locations and provenance.

Every new node gets

* ``meta['val']``: fake tensors propagated through the replacement (the op's fake kernel
  run on its inputs' fake values). Layer-stacked models repeat the same replacement with
  the same shapes hundreds of times, so results are cached by (op, input shapes, strides,
  dtypes, literal arguments); a cache hit reuses the fake value of the node being replaced
  when it has exactly the computed metadata, and otherwise makes a fresh fake tensor.
* ``stack_trace``, ``nn_module_stack`` (and ``source_fn_stack``, ``torch_fn``) of the node
  it replaces, or of the match's root;
* ``from_node``: torch's provenance list (:class:`torch.fx.traceback.NodeSource`, one per
  replaced node, action ``replace``), as torch's own passes record it;
* ``fxpass_provenance``: ``{"rule", "pass", "replaced", "location"}``.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
from torch.fx import Node
from torch.fx.node import map_aggregate

from ..edit.provenance import COPIED_META, node_sources, provenance_record
from ..fxutil.fx_internals import node_args, node_kwargs

__all__ = ["MetaPropagator"]


_NO = object()


def _fake_mode_of(vals: Iterable[Any]) -> Any:
    for v in vals:
        mode = getattr(v, "fake_mode", None)
        if mode is not None:
            return mode
    return None


def _spec(v: Any) -> Any:
    """A hashable description of a value's metadata (raises TypeError for symbolic shapes)."""
    if isinstance(v, torch.Tensor):
        device = getattr(v, "fake_device", None) or v.device  # FakeTensor.device is slow
        return ("T", v.shape, v.stride(), v.dtype, device)  # unhashable if shapes are symbolic
    if isinstance(v, (tuple, list)):
        return (type(v).__name__, tuple(_spec(x) for x in v))
    if isinstance(v, Node):
        raise TypeError("node")
    hash(v)
    return ("V", type(v).__name__, v)


def _val(n: Node) -> Any:
    """A node's fake value: ``meta['val']``, or Dynamo's ``meta['example_value']``."""
    meta = n.meta
    v = meta.get("val", _NO)
    return meta.get("example_value", _NO) if v is _NO else v


def _arg_spec(a: Any) -> Any:
    if isinstance(a, Node):
        val = _val(a)
        if val is _NO:
            raise TypeError("no val")
        return ("N", _spec(val))
    if isinstance(a, (tuple, list)):
        return (type(a).__name__, tuple(_arg_spec(x) for x in a))
    if isinstance(a, dict):
        return ("D", tuple((k, _arg_spec(v)) for k, v in a.items()))
    if isinstance(a, torch.Tensor):
        raise TypeError("tensor literal")
    return a


def _args_key(args: tuple) -> tuple:
    """The specs of a node's positional arguments (a flat loop for the common case)."""
    out = []
    for a in args:
        if a.__class__ is Node:
            v = _val(a)
            if isinstance(v, torch.Tensor):
                out.append((v.shape, v.stride(), v.dtype, getattr(v, "fake_device", None)))
                continue
            if v is _NO:
                raise TypeError("no val")
            out.append(("N", _spec(v)))
        elif isinstance(a, (list, tuple, dict, torch.Tensor)):
            out.append(_arg_spec(a))
        else:
            out.append(a)
    return tuple(out)


# The result's metadata depends only on the op and its inputs' metadata, so the cache is
# shared by every run in the process.
# (op, id(target), argument specs) -> (target, result spec): what a fake kernel computed.
_SPECS: dict[Any, tuple[Any, Any]] = {}


class MetaPropagator:
    """Fills in the metadata of new nodes; one per rewrite run."""

    def __init__(self) -> None:
        self.fake_mode: Any = None
        self.hits = 0
        self.misses = 0
        self.failures = 0

    # ----- values -----------------------------------------------------------------------
    def values(self, new: Sequence[Node], donors: Mapping[Node, Node], fallback: Node) -> None:
        """Set ``meta['val']`` on ``new`` (in graph order); ``donors`` maps a new node to
        the old node whose uses it takes over."""
        dynamo = "val" not in fallback.meta and "example_value" in fallback.meta
        for n in new:
            val = self._value(n, donors)
            if val is _NO:
                old = donors.get(n)
                if old is not None:
                    val = _val(old)  # the same value by construction of the rewrite
            if val is not _NO:
                n.meta["val"] = val
                if dynamo:  # Dynamo's backends read example_value
                    n.meta["example_value"] = val

    def _value(self, n: Node, donors: Mapping[Node, Node]) -> Any:
        args = node_args(n)
        if n.target is operator.getitem and args and isinstance(args[0], Node):
            src = _val(args[0])
            if isinstance(src, (tuple, list)):
                try:
                    return src[args[1]]
                except (IndexError, KeyError, TypeError):
                    return _NO
        try:
            kwargs = node_kwargs(n)
            key = (n.op, id(n.target), _args_key(args), _arg_spec(kwargs) if kwargs else ())
            hit = _SPECS.get(key)
        except TypeError:  # symbolic shapes or unhashable arguments: no cache
            key = hit = None
        if hit is not None and hit[0] is n.target:
            self.hits += 1
            try:
                return self._materialize(hit[1], n, donors, n)
            except LookupError:
                return _NO
        val = self._run(n)
        if val is _NO:
            self.failures += 1
            return _NO
        self.misses += 1
        if key is not None:
            try:
                spec = _spec(val)
                hash(spec)
                if len(_SPECS) > 4096:
                    _SPECS.clear()
                _SPECS[key] = (n.target, spec)  # the target keeps its id valid
            except TypeError:
                pass
        return val

    def _run(self, n: Node) -> Any:
        def arg(a: Any) -> Any:
            if isinstance(a, Node):
                v = _val(a)
                if v is _NO:
                    raise LookupError(a.name)
                return v
            return a

        try:
            args = map_aggregate(n.args, arg)
            kwargs = map_aggregate(n.kwargs, arg)
        except LookupError:
            return _NO
        mode = _fake_mode_of(_leaves((args, kwargs))) or self.fake_mode
        if mode is None:
            return _NO
        self.fake_mode = mode
        try:
            with mode:
                if n.op == "call_function":
                    return n.target(*args, **kwargs)
                if n.op == "call_method":
                    return getattr(args[0], n.target)(*args[1:], **kwargs)
        except Exception:  # broad: no fake kernel: no meta['val'], which the metadata check names
            return _NO
        return _NO

    def _materialize(self, spec: Any, n: Node | None, donors: Mapping[Node, Node], at: Node):
        """A value with metadata ``spec`` for node ``n``: a donor's value if it fits."""
        kind = spec[0]
        if kind == "T":
            old = donors.get(n) if n is not None else None
            if old is not None:
                have = _val(old)
                if isinstance(have, torch.Tensor):
                    try:
                        if _spec(have) == spec:
                            return have
                    except TypeError:
                        pass
            return self._fresh(spec, at)
        if kind in ("tuple", "list"):
            items = []
            for i, s in enumerate(spec[1]):
                donor = _element_donor(n, i, donors)
                items.append(self._materialize(s, donor, donors, at))
            return tuple(items) if kind == "tuple" else items
        return spec[2]

    def _fresh(self, spec: Any, at: Node) -> Any:
        from torch._subclasses.fake_tensor import FakeTensor

        mode = self.fake_mode
        if mode is None:
            vals = [_val(a) for a in at.all_input_nodes]
            mode = self.fake_mode = _fake_mode_of(_leaves(vals))
        if mode is None:
            raise LookupError("no fake mode")
        _, shape, stride, dtype, device = spec
        meta = torch.empty_strided(shape, stride, dtype=dtype, device="meta")
        return FakeTensor(mode, meta, device)

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


def _element_donor(n: Node | None, i: int, donors: Mapping[Node, Node]) -> Node | None:
    """For element ``i`` of a tuple-valued new node: the getitem user that has a donor."""
    if n is None:
        return None
    for u in n.users:
        if u.target is operator.getitem and len(u.args) > 1 and u.args[1] == i and u in donors:
            return u
    return None


def _leaves(tree: Any):
    if isinstance(tree, (list, tuple)):
        for x in tree:
            yield from _leaves(x)
    elif isinstance(tree, dict):
        for x in tree.values():
            yield from _leaves(x)
    else:
        yield tree
