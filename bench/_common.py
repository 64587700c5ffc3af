"""Shared helpers for the benchmarks: exported Llama-style graphs and robust timing."""

from __future__ import annotations

import argparse
import gc
import math
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from fxpass.models.llama import build_decoder

_EXPORTS: dict[tuple, Any] = {}


def exported_decoder(layers: int, *, remove_asserts: bool = True, **config: Any):
    """An exported, core-ATen (run_decompositions) Llama-style decoder of ``layers`` layers.

    Returns ``(exported_program, model, example_inputs)``; export's
    ``aten._assert_tensor_metadata`` nodes are removed unless ``remove_asserts=False``.
    """
    key = (layers, remove_asserts, tuple(sorted(config.items())))
    if key not in _EXPORTS:
        model = build_decoder(layers=layers, **config)
        inputs = model.example_inputs()
        ep = torch.export.export(model, inputs).run_decompositions()
        if remove_asserts:
            graph = ep.graph_module.graph
            for node in list(graph.nodes):
                if node.target is torch.ops.aten._assert_tensor_metadata.default:
                    graph.erase_node(node)
            ep.graph_module.recompile()
        _EXPORTS[key] = (ep, model, inputs)
    return _EXPORTS[key]


def timeit(fn: Callable[[], Any], *, repeat: int = 3, setup: Callable[[], Any] | None = None):
    """Median wall time of ``fn`` in seconds over ``repeat`` runs (``setup`` untimed)."""
    times = []
    for _ in range(repeat):
        state = setup() if setup else None
        gc.collect()
        gc.disable()
        try:
            t0 = time.perf_counter()
            fn() if state is None else fn(state)
            times.append(time.perf_counter() - t0)
        finally:
            gc.enable()
    return statistics.median(times)


def scaling_exponent(sizes: Sequence[float], times: Sequence[float]) -> float:
    """The least-squares slope of log(time) against log(size)."""
    xs = [math.log(s) for s in sizes]
    ys = [math.log(max(t, 1e-9)) for t in times]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    num = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    den = sum((x - mx) ** 2 for x in xs)
    return num / den if den else float("nan")


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="small sizes, for a smoke test")
    p.add_argument("--repeat", type=int, default=3)
    return p


def run_exported(ep, gm, inputs):
    """The first output of ``gm`` (the ExportedProgram's graph, maybe rewritten) run on the
    program's parameters, buffers and constants and ``inputs``."""
    args = []
    for spec in ep.graph_signature.input_specs:
        if spec.kind.name == "USER_INPUT":
            continue
        target = spec.target
        args.append(ep.state_dict[target] if target in ep.state_dict else ep.constants[target])
    gm.recompile()
    with torch.no_grad():
        return gm(*args, *inputs)[0]


def to_inductor_dialect(gm):
    """``aten._to_copy(x, dtype=d)`` -> ``prims.convert_element_type(x, d)``: the spelling
    Inductor's decompositions (and so its traced patterns) use."""
    for n in list(gm.graph.nodes):
        if n.target is torch.ops.aten._to_copy.default and set(n.kwargs) == {"dtype"}:
            n.target = torch.ops.prims.convert_element_type.default
            n.args, n.kwargs = (n.args[0], n.kwargs["dtype"]), {}
    gm.recompile()
    return gm


def noop_returning_none(gm):
    """A no-op pass: looks at every node, changes nothing, does not say so (the pipeline
    detects it)."""
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is None:  # never true
            return True
    return None


def noop_returning_false(gm):
    """A no-op pass that says it changed nothing."""
    for _ in gm.graph.nodes:
        pass
    return False
