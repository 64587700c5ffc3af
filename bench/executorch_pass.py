"""ExecuTorch's ExportPass against fxpass.compat.executorch.ExportPass, pass for pass.

(bench/executorch.py times ExecuTorch's whole lowering with and without install().)

The same two passes, written once against ExecuTorch's hooks, run through
``executorch.exir.pass_base.ExportPass`` and through ``fxpass.compat.executorch.ExportPass``
on the Edge programs (``to_edge``) of the embedded Llama-style decoder, float32, with 2, 16
and 64 layers:

* identity: ``ExportPass`` itself, every node copied;
* real: ``relu_`` -> ``relu`` and ``add`` -> ``mul`` + ``sub`` (the seed's examples).

Prints milliseconds per pass, microseconds per node and the ratio (ExecuTorch / fxpass),
and checks that both produce the same graph: the same nodes in the same order, the same
outputs on the same inputs, the same ``val`` / ``stack_trace`` / ``nn_module_stack`` /
``debug_handle`` on every node. Target: fxpass at least 10x faster at 16 layers.

Times are the CPU time of this process (``time.process_time``, the best of ``--repeat``
runs), so other work on a shared machine does not skew the ratio; on an idle machine wall
time is about the same (both passes run single-threaded Python).

    python bench/executorch_pass.py            # 2, 16, 64 layers (to_edge of 64 layers takes minutes)
    python bench/executorch_pass.py --quick    # 1 layer, a smoke test
"""

from __future__ import annotations

import gc
import os
import sys
import time

# python puts this file's folder first on the path, where bench/executorch.py would stand in
# for the executorch package: out while executorch is imported, back in for _common
sys.path.remove(sys.path[0])

import torch
from executorch.exir import EdgeCompileConfig, to_edge
from executorch.exir.dialects._ops import ops as exir_ops
from executorch.exir.pass_base import ExportPass as ExecuTorchExportPass
from torch.export.graph_signature import InputKind

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import parser

from fxpass.compat.executorch import ExportPass as FxpassExportPass
from fxpass.fxutil.values import same_value
from fxpass.models.llama import build_decoder

TARGET = 10.0
_META = ("stack_trace", "nn_module_stack", "debug_handle")
_INPLACE_RELU = (torch.ops.aten.relu_.default, exir_ops.edge.aten.relu_.default)


def real_pass(base: type) -> type:
    """relu_ -> relu and add -> mul + sub, as a backend author writes it against ``base``."""

    class ReluAndAddToMulSub(base):
        def call_operator(self, op, args, kwargs, meta):
            if op in _INPLACE_RELU:
                relu = exir_ops.edge.aten.relu.default
                return super().call_operator(relu, args, kwargs, meta)
            if op != exir_ops.edge.aten.add.Tensor:
                return super().call_operator(op, args, kwargs, meta)
            x, y = args
            z = super().call_operator(exir_ops.edge.aten.mul.Tensor, (x, y), {}, meta)
            return super().call_operator(exir_ops.edge.aten.sub.Tensor, (z, y), {}, meta)

    return ReluAndAddToMulSub


def edge_decoder(layers: int):
    """The Edge program of the decoder, and its example inputs."""
    model = build_decoder(layers=layers, dtype=torch.float32)
    inputs = model.example_inputs()
    edge = to_edge(torch.export.export(model, inputs), compile_config=EdgeCompileConfig())
    return edge.exported_program(), inputs


def run_graph(ep, gm, inputs):
    """Run ``gm`` (an Edge graph of ``ep``'s signature) on the program's state and ``inputs``."""
    user = iter(inputs)
    args = []
    for spec in ep.graph_signature.input_specs:
        if spec.kind == InputKind.USER_INPUT:
            args.append(next(user))
        elif spec.target in ep.state_dict:
            args.append(ep.state_dict[spec.target])
        else:  # lifted constants, non-persistent buffers
            args.append(ep.constants[spec.target])
    with torch.no_grad():
        return gm(*args)


def same_graphs(a, b) -> str | None:
    """None if ``a`` and ``b`` are the same graph with the same metadata, else what differs."""
    na, nb = list(a.graph.nodes), list(b.graph.nodes)
    if len(na) != len(nb):
        return f"{len(na)} nodes against {len(nb)}"
    for x, y in zip(na, nb):
        if (x.op, x.name, x.target, str(x.args), str(x.kwargs)) != (
            y.op,
            y.name,
            y.target,
            str(y.args),
            str(y.kwargs),
        ):
            return f"node {x.format_node()} against {y.format_node()}"
        if not same_value(x.meta.get("val"), y.meta.get("val")):
            return f"meta['val'] of {x.name}: {x.meta.get('val')} against {y.meta.get('val')}"
        for key in _META:
            if x.meta.get(key) != y.meta.get(key):
                return f"meta[{key!r}] of {x.name} differs"
    return None


def cpu_time(fn, repeat: int) -> float:
    """The least CPU time of ``repeat`` runs of ``fn`` (after one untimed run), in seconds."""
    fn()
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        gc.disable()
        try:
            start = time.process_time()
            fn()
            best = min(best, time.process_time() - start)
        finally:
            gc.enable()
    return best


def measure(ep, inputs, name: str, et_cls: type, fx_cls: type, repeat: int) -> tuple:
    gm = ep.graph_module
    nodes = len(gm.graph.nodes)
    et_result, fx_result = et_cls()(gm), fx_cls()(gm)
    problem = same_graphs(et_result.graph_module, fx_result.graph_module)
    if problem:
        raise SystemExit(f"{name}: the graphs differ: {problem}")
    et_out = run_graph(ep, et_result.graph_module, inputs)
    fx_out = run_graph(ep, fx_result.graph_module, inputs)
    same = (torch.allclose(a, b, rtol=0, atol=0, equal_nan=True) for a, b in zip(et_out, fx_out))
    if len(et_out) != len(fx_out) or not all(same):
        raise SystemExit(f"{name}: the outputs differ")
    t_et = cpu_time(lambda: et_cls()(gm), repeat)
    t_fx = cpu_time(lambda: fx_cls()(gm), repeat)
    changed = "changed" if fx_result.modified else "unchanged"
    print(
        f"  {name:9s} {nodes:6d} nodes  ExecuTorch {t_et * 1e3:8.1f} ms ({t_et / nodes * 1e6:6.1f} "
        f"us/node)  fxpass {t_fx * 1e3:7.1f} ms ({t_fx / nodes * 1e6:5.1f} us/node)  "
        f"ratio {t_et / t_fx:5.1f}x  ({changed}, same graph and outputs)"
    )
    return t_et / t_fx


def main(argv=None) -> int:
    args = parser(__doc__.splitlines()[0]).parse_args(argv)
    sizes = (1,) if args.quick else (2, 16, 64)
    ratios = {}
    for layers in sizes:
        t0 = time.perf_counter()
        ep, inputs = edge_decoder(layers)
        print(f"{layers} layers (to_edge {time.perf_counter() - t0:.1f} s):")
        ratios[layers] = [
            measure(ep, inputs, "identity", ExecuTorchExportPass, FxpassExportPass, args.repeat),
            measure(
                ep,
                inputs,
                "real",
                real_pass(ExecuTorchExportPass),
                real_pass(FxpassExportPass),
                args.repeat,
            ),
        ]
    key = 16 if 16 in ratios else max(ratios)
    worst = min(ratios[key])
    verdict = "meets" if worst >= TARGET else "misses"
    print(f"ratio at {key} layers: {worst:.1f}x at worst ({verdict} the {TARGET:.0f}x target)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
