"""Inductor's helpers that pattern files call: ``stable_topological_sort``,
``init_once_fakemode``, ``is_match``."""

from __future__ import annotations

import functools
import inspect
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from torch import fx
from torch.fx import Node

from ...edit.editor import Editor

__all__ = ["init_once_fakemode", "is_match", "stable_topological_sort"]


def is_match(m: Any) -> bool:
    """Whether ``m`` is a match (a FailedMatch is falsy)."""
    return bool(m)


def stable_topological_sort(graph: fx.Graph) -> None:
    """Order ``graph`` topologically, moving as few nodes as possible: a node waits for the
    last of its inputs not yet placed and follows it (Inductor's order, node for node).
    Moves go through fxpass's editor."""
    editor = Editor.current("stable_topological_sort")  # called by torch and vLLM, no ctx
    pending = list(reversed(graph.nodes))
    ready: set[Node] = set()
    waiting: defaultdict[Node, list[Node]] = defaultdict(list)
    cursor: Node | None = None
    while pending:
        node = pending.pop()
        inputs: list[Node] = []
        fx.map_arg((node.args, node.kwargs), inputs.append)  # in order, repeats kept
        waiting_for = [x for x in inputs if x not in ready]
        if waiting_for:
            waiting[waiting_for[-1]].append(node)
            continue
        ready.add(node)
        if cursor is not None and cursor.next is not node:
            editor.move(node, after=cursor, rule="stable_topological_sort")
        cursor = node
        pending.extend(reversed(waiting.pop(node, ())))
    if waiting or len(ready) != len(graph.nodes):
        raise RuntimeError("stable_topological_sort: the graph has a cycle")


def init_once_fakemode(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A lazy initializer run once, under a fresh fake mode (patterns registered inside it
    trace on fake tensors); Inductor's counters are left as they were."""
    params = inspect.signature(fn).parameters

    @functools.cache
    @functools.wraps(fn)
    def lazy_init(input_device: Any = None, get_decomp_fn: Any = None) -> Any:
        import torch
        from torch._dynamo.utils import counters
        from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily

        before = counters["inductor"].copy()
        kwargs: dict[str, Any] = {}
        if "input_device" in params:
            kwargs["input_device"] = input_device
        if "get_decomp_fn" in params and get_decomp_fn is not None:
            kwargs["get_decomp_fn"] = get_decomp_fn
        with torch._guards.tracing(None), unset_fake_temporarily(), FakeTensorMode():
            result = fn(**kwargs)
        counters["inductor"] = before
        return result

    return lazy_init
