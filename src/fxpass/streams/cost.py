"""What a node costs on the GPU, estimated from ``meta['val']``: FLOPs, bytes, microseconds.

A kernel takes ``max(flops / peak_flops, bytes / bandwidth)``, and never less than
``kernel_us`` (small kernels leave most of the GPU idle: that idle part is what a second
stream can fill). Matrix products count ``2·M·N·K`` FLOPs, convolutions ``2 · out ·
in_channels/groups · kernel area``, attention ``4·B·H·L·S·D``; every other op one FLOP per
element. Bytes are the inputs read plus the outputs written. Views, ``getitem`` and stream
ops cost nothing. The defaults are an H100-class GPU in bf16; they only need to rank work,
not predict it.

>>> model = CostModel()
>>> model.node_us(mm_node)                                        # doctest: +SKIP
2.0
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

from ..edit.alias import is_kernel
from ..fxutil.dialect import aten_op
from ..fxutil.values import node_val

__all__ = ["CostModel", "node_bytes", "node_flops"]

aten = torch.ops.aten

_MATMULS = frozenset({aten.mm.default, aten.bmm.default, aten.matmul.default})
_BIASED = frozenset({aten.addmm.default, aten.baddbmm.default})
_LINEAR = frozenset({aten.linear.default})
_CONV = frozenset({aten.convolution.default, aten.conv2d.default, aten.conv1d.default})
_ATTENTION_NAMES = (
    "scaled_dot_product_attention",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
)


def _num(x: Any) -> int:
    """A size as a number: symbolic sizes by their hint (1 when there is none)."""
    if isinstance(x, int):
        return x
    hint = getattr(getattr(x, "node", None), "hint", None)
    return int(hint) if hint is not None else 1


def _numel(t: torch.Tensor) -> int:
    n = 1
    for s in t.shape:
        n *= _num(s)
    return n


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def _arg_val(node: fx.Node, i: int) -> Any:
    return node_val(node.args[i]) if i < len(node.args) else None


def node_flops(node: fx.Node) -> float:
    """Floating-point operations of one call, from the shapes in ``meta['val']``."""
    target = aten_op(node.target)
    outs = _tensors(node_val(node))
    out = sum(_numel(t) for t in outs)
    first = 1 if target in _BIASED else 0
    a = _arg_val(node, first)
    matmul = target in _MATMULS or target in _BIASED or target in _LINEAR
    if matmul and isinstance(a, torch.Tensor) and a.dim() >= 1:
        return 2.0 * out * _num(a.shape[-1])
    if target in _CONV:
        w = _arg_val(node, 1)
        if isinstance(w, torch.Tensor) and w.dim() >= 2:
            return 2.0 * out * _numel(w) / max(_num(w.shape[0]), 1)
    name = getattr(getattr(target, "_overloadpacket", None), "__name__", "")
    if name in _ATTENTION_NAMES:
        q, k = _arg_val(node, 0), _arg_val(node, 1)
        if isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor) and q.dim() >= 2:
            return 4.0 * _numel(q) * _num(k.shape[-2])
    ins = sum(_numel(t) for i in node.all_input_nodes for t in _tensors(node_val(i)))
    return float(max(out, ins))


def node_bytes(node: fx.Node) -> float:
    """Bytes moved by one call: every tensor input read once, every output written once."""
    total = 0
    for value in [node_val(i) for i in node.all_input_nodes] + [node_val(node)]:
        total += sum(_numel(t) * t.element_size() for t in _tensors(value))
    return float(total)


@dataclass(frozen=True)
class CostModel:
    """Roofline estimate of GPU time per node, and the price of one cross-stream sync.

    Args:
        peak_flops: FLOP/s the matrix units reach.
        bandwidth: bytes/s from memory.
        kernel_us: the least time a kernel takes (launch latency, a partly idle GPU).
        event_us: what one record + wait pair costs.
    """

    peak_flops: float = 400e12
    bandwidth: float = 2.0e12
    kernel_us: float = 2.0
    event_us: float = 1.0

    def __post_init__(self) -> None:
        for name in ("peak_flops", "bandwidth"):
            if getattr(self, name) <= 0:
                raise ValueError(f"CostModel.{name} must be positive, not {getattr(self, name)}")
        for name in ("kernel_us", "event_us"):
            if getattr(self, name) < 0:
                raise ValueError(f"CostModel.{name} must be >= 0, not {getattr(self, name)}")

    def node_us(self, node: fx.Node) -> float:
        """Estimated microseconds of ``node`` on the GPU (0 for what runs no kernel)."""
        if not is_kernel(node):
            return 0.0
        compute = node_flops(node) / self.peak_flops
        memory = node_bytes(node) / self.bandwidth
        return max(self.kernel_us, 1e6 * max(compute, memory))

    def nodes_us(self, nodes: Any) -> float:
        return sum(self.node_us(n) for n in nodes)
