"""Where a graph multiplies by its weights: linear, grouped and embedding sites, in every IR
spelling.

A *site* is one use of a 2-D weight — ``x @ W.T (+ b)`` or ``W[ids]`` — or of a 3-D stack of
expert weights: in a grouped matmul (``grouped_mm(x, W[E, in, out], offsets)``: rows of
``x`` sorted by expert, ``offsets`` where each expert's rows end; torch's ``_grouped_mm``
or ``transformers::grouped_mm_fallback``, registered by ``transformers.integrations.moe``)
or a batched one (``bmm(x[E, T, in], W[E, in, out])``: every expert on its copy of the
tokens, as Llama 4 runs them); the stack may be transposed on its way. Export keeps
``aten.linear``; core ATen, AOTAutograd and Inductor graphs spell it
``mm(x, permute(W, [1, 0]))`` or ``addmm(b, x, t(W))``; torch-level code may write
``matmul(x, W.t())``. ExecuTorch Edge ops are read as the ATen ops they wrap. The weights
are found from the graph alone — placeholders (parameters of an ExportedProgram, or graph
inputs of an AOT graph) and ``get_attr`` tensors — never from module names.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx
from torch.export.graph_signature import ExportGraphSignature, InputKind

from ..fxutil.dialect import aten_op

__all__ = ["SAME_VALUE", "Params", "Site", "find_sites", "target_of"]

aten = torch.ops.aten

#: Ops whose result holds the values of their input (views, copies, casts).
SAME_VALUE = {
    aten.view.default,
    aten.reshape.default,
    aten._unsafe_view.default,
    aten.view_copy.default,
    aten.flatten.using_ints,
    aten.unsqueeze.default,
    aten.alias.default,
    aten.clone.default,
    aten.contiguous.default,
    aten._to_copy.default,
    aten.to.dtype,
    aten.to.dtype_layout,
}

_TRANSPOSES = {aten.permute.default, aten.t.default, aten.transpose.int}


def target_of(node: fx.Node) -> Any:
    """The ATen op a call_function node runs (Edge ops read as ATen), else its target."""
    return aten_op(node.target) if node.op == "call_function" else node.target


def _val(node: Any) -> Any:
    return node.meta.get("val") if isinstance(node, fx.Node) else None


class Params:
    """Which nodes of a graph are weights, and their names.

    With an ExportedProgram's signature, parameters, buffers and constant tensors are
    weights and are named by their state-dict key; without one (an AOT graph, a traced
    module) every placeholder and ``get_attr`` tensor may be, named after the node.
    """

    def __init__(self, gm: fx.GraphModule, signature: ExportGraphSignature | None = None):
        self.gm = gm
        self._names: dict[str, str] = {}
        self._user: set[str] = set()
        if signature is not None:
            for spec in signature.input_specs:
                name = getattr(spec.arg, "name", None)
                if name is None:
                    continue
                if spec.kind in (InputKind.USER_INPUT, InputKind.TOKEN):
                    self._user.add(name)
                elif spec.target is not None:
                    self._names[name] = spec.target

    def is_weight(self, node: Any) -> bool:
        if not isinstance(node, fx.Node) or node.op not in ("placeholder", "get_attr"):
            return False
        if node.name in self._user:
            return False
        return isinstance(_val(node), torch.Tensor) or node.op == "get_attr"

    def name(self, node: fx.Node) -> str:
        """The weight's state-dict key (or the node's name when there is none)."""
        if node.op == "get_attr":
            return str(node.target)
        return self._names.get(node.name, node.name)

    def by_name(self) -> dict[str, fx.Node]:
        return {self.name(n): n for n in self.gm.graph.nodes if self.is_weight(n)}


@dataclass(eq=False)
class Site:
    """One use of a weight. ``node`` computes the result, ``input`` is the activation
    (token ids for an embedding), ``path`` the transposes between the weight and ``node``;
    ``out_dim`` and ``in_dim`` are the weight's dims of output and input features (0 and 1
    for a linear weight; 2 and 1, or 1 and 2 when transposed, for a grouped one)."""

    kind: str  # "linear", "grouped", "batched" or "embedding"
    node: fx.Node
    input: fx.Node
    weight: fx.Node
    bias: fx.Node | None = None
    path: tuple[fx.Node, ...] = ()
    out_dim: int = 0
    in_dim: int = 1

    @property
    def out_features(self) -> int:
        return int(_val(self.weight).shape[self.out_dim])

    @property
    def in_features(self) -> int:
        return int(_val(self.weight).shape[self.in_dim])

    def __repr__(self) -> str:
        return f"Site({self.kind} {self.node.name}: {self.weight.name})"


def _transposed_weight(node: Any, params: Params) -> tuple[fx.Node, fx.Node] | None:
    """``W`` when ``node`` is ``W.T`` (permute [1, 0], t, transpose 0 1) of a 2-D weight."""
    if not isinstance(node, fx.Node) or node.op != "call_function":
        return None
    op = target_of(node)
    if op not in _TRANSPOSES:
        return None
    w = node.args[0]
    if op is aten.permute.default and list(node.args[1]) != [1, 0]:
        return None
    if op is aten.transpose.int and sorted(d % 2 for d in node.args[1:3]) != [0, 1]:
        return None
    if not params.is_weight(w) or _val(w) is None or _val(w).dim() != 2:
        return None
    return w, node


def _weight_2d(node: Any, params: Params) -> bool:
    return params.is_weight(node) and _val(node) is not None and _val(node).dim() == 2


def _bias_1d(node: Any, params: Params) -> bool:
    return params.is_weight(node) and _val(node) is not None and _val(node).dim() == 1


#: Grouped matmuls ``(x[S, in], W[E, in, out], offsets[E]) -> [S, out]``, by schema name.
GROUPED_MM = {"aten::_grouped_mm", "transformers::grouped_mm_fallback"}
_THROUGH = {aten._to_copy.default, aten.to.dtype, aten.to.dtype_layout, aten.clone.default,
            aten.contiguous.default, aten.alias.default}  # fmt: skip


def is_grouped_mm(op: Any) -> bool:
    """Whether ``op`` is a grouped matmul: one of :data:`GROUPED_MM`, or an op named like one."""
    name = getattr(getattr(op, "_schema", None), "name", "")
    return name in GROUPED_MM or name.endswith("grouped_mm") or name.endswith("grouped_mm_fallback")


def _stacked_weight(node: Any, params: Params) -> tuple[fx.Node, tuple, bool] | None:
    """``(W, path, transposed)`` when ``node`` is a 3-D weight, maybe transposed (last two
    dims) or cast on its way."""
    path: list[fx.Node] = []
    transposed = False
    while isinstance(node, fx.Node) and node.op == "call_function":
        op = target_of(node)
        swap = (op is aten.transpose.int and sorted(d % 3 for d in node.args[1:3]) == [1, 2]) or (
            op is aten.permute.default and [d % 3 for d in node.args[1]] == [0, 2, 1]
        )
        if swap:
            transposed = not transposed
        elif op not in _THROUGH:
            return None
        path.insert(0, node)
        node = node.args[0]
    if not params.is_weight(node) or _val(node) is None or _val(node).dim() != 3:
        return None
    return node, tuple(path), transposed


def _site(node: fx.Node, params: Params) -> Site | None:
    op = target_of(node)
    args = node.args
    stacked = "grouped" if is_grouped_mm(op) else None
    if op in (aten.bmm.default, aten.matmul.default):
        stacked = "batched"
    if stacked is not None and len(args) >= 2:  # x[S, in] or x[E, T, in] @ W[E, in, out]
        found = _stacked_weight(args[1], params)
        x = _val(args[0])
        rank = 2 if stacked == "grouped" else 3
        if found is not None and isinstance(x, torch.Tensor) and x.dim() == rank:
            w, path, transposed = found
            out_dim, in_dim = (1, 2) if transposed else (2, 1)
            return Site(stacked, node, args[0], w, None, path, out_dim, in_dim)
    if op is aten.linear.default and _weight_2d(args[1], params):
        bias = args[2] if len(args) > 2 else node.kwargs.get("bias")
        if bias is not None and not _bias_1d(bias, params):
            return None
        return Site("linear", node, args[0], args[1], bias)
    if op in (aten.mm.default, aten.matmul.default):
        found = _transposed_weight(args[1], params)
        if found is not None:
            return Site("linear", node, args[0], found[0], None, (found[1],))
    if op is aten.addmm.default and not node.kwargs:
        found = _transposed_weight(args[2], params)
        if found is not None and _bias_1d(args[0], params):
            return Site("linear", node, args[1], found[0], args[0], (found[1],))
    if op is aten.embedding.default and _weight_2d(args[0], params):
        return Site("embedding", node, args[1], args[0])
    return None


def find_sites(gm: fx.GraphModule, params: Params) -> Iterator[Site]:
    """Every linear and embedding site of ``gm``, in graph order."""
    for node in gm.graph.nodes:
        if node.op == "call_function":
            site = _site(node, params)
            if site is not None:
                yield site
