"""The Edge verifier's dtype check is not run again on a graph of a shape it already passed.

ExecuTorch's Edge verifier (``EXIREdgeDialectVerifier``) checks every program it builds:
besides cheap checks of the ops, its ``_check_tensor_args_matching_op_allowed_dtype`` runs
every node of the graph on fake tensors (an ``fx.Interpreter``) to read the dtypes each
operator receives, and compares them with the dtypes the Edge operator allows. Its lowering
asks again and again about graphs it has already checked: the program it has just built
(``to_edge``, the ``EdgeProgramManager``, ``to_backend`` and its fake copy check the same
graph four times), and one delegate per partition, 82 for a 16-layer decoder, where every
layer's partitions are the same graph over other tensors.

The answer is a function of what the check reads, so :func:`dtype_check` runs it once per
:func:`graph_shape`: per node its kind, target, the positions of the nodes its arguments
name and the literals among them, and the metadata of its ``meta['val']`` (type, dtype,
sizes, strides, offset, device, ``requires_grad``); for a ``get_attr``, the same metadata of
the attribute it fetches (a module by identity), not its name. Names are left out (the
check never reads them), so the layers' delegates share one answer. A graph with symbolic sizes, an input or
operator node without ``val``, or a value the shape cannot describe is checked every
time, as is any graph whose check failed.

Where it does run, :func:`arg_validator` gives it ExecuTorch's ``EdgeOpArgValidator`` with
one change: an op's fake result is taken from fxpass's cache of fake results by op and
input metadata (:data:`~fxpass.fxutil.values.FAKE_RESULTS`, which the passes fill) where it
holds one. The validator reads only the metadata of those results, and an op that fails is
never cached, so it finds what it finds when it runs every op.

>>> check = dtype_check(original)       # doctest: +SKIP
>>> check(gm)                           # doctest: +SKIP
>>> check(same_graph_other_layer)       # doctest: +SKIP

The first call runs the interpreter; the second, on a graph of the same shape, passes at
once.
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import fx
from torch._subclasses.fake_tensor import FakeTensor

from ...fxutil.values import FakeEvaluator, Strictness

__all__ = ["arg_validator", "dtype_check", "graph_shape"]

_LIMIT = 512  # shapes remembered (a shape holds only metadata, no tensor or graph)
_NO_VAL = object()
_NEEDS_VAL = frozenset(("placeholder", "call_function"))  # the nodes whose ``val`` it reads


class _Unknown(Exception):
    """A value :func:`graph_shape` cannot describe by its metadata."""


def _value(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        if any(not isinstance(s, int) for s in (*v.shape, *v.stride(), v.storage_offset())):
            raise _Unknown
        return (
            type(v),
            v.dtype,
            tuple(v.shape),
            v.stride(),
            v.storage_offset(),
            v.device,
            v.requires_grad,
        )
    if v is None or isinstance(v, (bool, int, float, str, torch.dtype, torch.device)):
        return (type(v), v)
    if isinstance(v, (list, tuple)):
        return (type(v), tuple(_value(x) for x in v))
    raise _Unknown


def _attribute(gm: fx.GraphModule, target: str) -> Any:
    obj: Any = gm
    for atom in target.split("."):
        obj = getattr(obj, atom, None)
    if isinstance(obj, torch.Tensor):
        return _value(obj)
    return (type(obj), id(obj))  # a module (a lowered delegate): itself


def _literal(a: Any) -> Any:
    if isinstance(a, (list, tuple)):
        return (type(a), tuple(_literal(x) for x in a))
    if isinstance(a, dict):
        return (dict, tuple((k, _literal(v)) for k, v in a.items()))
    if isinstance(a, (torch.Tensor, torch.nn.Module)):
        raise _Unknown  # a literal tensor or module argument: described by identity nowhere
    try:
        hash(a)
    except TypeError:
        raise _Unknown from None
    return (type(a), a)


def graph_shape(gm: fx.GraphModule) -> tuple | None:
    """What the dtype check reads of ``gm``, without names; None where it cannot be told
    (then the check runs)."""
    index: dict[fx.Node, int] = {}

    def arg(a: Any) -> Any:
        if isinstance(a, fx.Node):
            return ("%", index[a])
        if isinstance(a, (list, tuple)):
            return (type(a), tuple(arg(x) for x in a))
        if isinstance(a, dict):
            return (dict, tuple((k, arg(v)) for k, v in a.items()))
        return _literal(a)

    shape = []
    try:
        for i, node in enumerate(gm.graph.nodes):
            index[node] = i
            val = node.meta.get("val", _NO_VAL)
            if val is _NO_VAL and node.op in _NEEDS_VAL:
                return None  # the check would derive a value itself
            op, target = node.op, node.target
            if op == "get_attr":
                target = _attribute(gm, target)
            elif op == "placeholder":
                target = None  # a name, as the output's
            value = None if val is _NO_VAL else _value(val)
            shape.append((op, target, arg(node.args), arg(node.kwargs), value))
    except _Unknown:
        return None
    return tuple(shape)


def dtype_check(check: Callable[[fx.GraphModule], None]) -> Callable[[fx.GraphModule], None]:
    """``check`` (ExecuTorch's ``_check_tensor_args_matching_op_allowed_dtype``) run once
    per :func:`graph_shape` that passed."""
    passed: collections.OrderedDict[tuple, None] = collections.OrderedDict()

    @functools.wraps(check)
    def checked(gm: fx.GraphModule) -> None:
        shape = graph_shape(gm)
        if shape is not None and shape in passed:
            passed.move_to_end(shape)
            return
        check(gm)
        if shape is not None:
            passed[shape] = None
            if len(passed) > _LIMIT:
                passed.popitem(last=False)

    checked.passed = passed  # type: ignore[attr-defined]
    return checked


def _fake_mode(values: Any) -> Any:
    """The fake mode of the first fake tensor among ``values`` (and the lists in them)."""
    for v in values:
        if isinstance(v, FakeTensor):
            return v.fake_mode
        if isinstance(v, (list, tuple)):
            mode = _fake_mode(v)
            if mode is not None:
                return mode
    return None


class _CachedResults(fx.Interpreter):
    """Runs an op on fake values through fxpass's fake-value evaluator (strict, as the
    validator is), which takes its result from :data:`FAKE_RESULTS` where it can."""

    def call_function(self, target: Any, args: Any, kwargs: Any) -> Any:
        mode = _fake_mode(args) or _fake_mode(kwargs.values())
        evaluator = FakeEvaluator(mode, strictness=Strictness.RAISE, owner="Edge verifier")
        return evaluator.run(target, args, kwargs, call=super().call_function)


def arg_validator(validator: type[fx.Interpreter]) -> type[fx.Interpreter]:
    """ExecuTorch's ``EdgeOpArgValidator`` class, its ops run through :data:`FAKE_RESULTS`."""
    return type(validator.__name__, (validator, _CachedResults), {"__module__": __name__})
