"""Source partitions: group a graph's nodes by the module or function they came from.

After export and decomposition an ``nn.Linear`` is a ``permute``, a ``view``, an ``mm`` and a
``view``; a backend that lowers whole linears wants them back as one group.
:func:`source_partitions` finds them from the metadata export leaves on every node:

* ``source_fn_stack`` (Dynamo / strict export): ``[(name, module type or function), ...]``;
* ``torch_fn`` (export): ``("linear_1", "builtin_function_or_method.linear")`` — the call;
* ``nn_module_stack`` (export): ``{key: (fqn, module class)}`` — the modules around the node.

A wanted source is a module type (``torch.nn.Linear``: one partition per module instance,
keyed by its path ``layers.0.self_attn.q_proj``), a function (``F.linear``: one partition per
call), or a name (``"linear"``, the function's name as ``torch_fn`` records it). Each
:class:`SourcePartition` lists its nodes, the nodes it reads (``input_nodes``), the nodes read
outside it (``output_nodes``) and its parameters (``params``: ``get_attr`` nodes, or on an
ExportedProgram the parameter and buffer placeholders it reads), all in graph order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx

from .base import module_and_graph

__all__ = ["SourcePartition", "check_subgraphs_connected", "source_partitions", "torch_keys"]


@dataclass
class SourcePartition:
    """Nodes that came from one module instance or one function call."""

    nodes: list[fx.Node]
    source: Any
    input_nodes: list[fx.Node] = field(default_factory=list)
    output_nodes: list[fx.Node] = field(default_factory=list)
    params: list[fx.Node] = field(default_factory=list)
    name: str = ""  # the module path or the call's name (fxpass addition)

    def __iter__(self):
        return iter(self.nodes)

    def __len__(self) -> int:
        return len(self.nodes)


def _class_path(cls: Any) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _matches_module(cls: Any, src: Any) -> bool:
    if isinstance(src, type):
        if isinstance(cls, type):
            return issubclass(cls, src)
        return isinstance(cls, str) and cls == _class_path(src)
    return cls == src


def torch_keys(node: fx.Node, wanted: Sequence[Any]) -> tuple[Any, str] | None:
    """torch's ``get_source_partitions`` rules for one node: (source, instance key)."""
    stack = node.meta.get("source_fn_stack")
    if stack is not None:
        name, fn = stack[-1]
        return (fn, name) if fn in wanted else None
    torch_fn = node.meta.get("torch_fn")
    if torch_fn is not None:
        call, described = torch_fn
        fn_name = described.split(".")[1]
        if fn_name in wanted:
            return fn_name, call
    if node.op == "call_function" and node.meta.get("nn_module_stack"):
        fqn, cls = list(node.meta["nn_module_stack"].values())[-1]
        for src in wanted:
            if _matches_module(cls, src):
                return src, fqn
    return None


def _fxpass_keys(node: fx.Node, wanted: Sequence[Any]) -> tuple[Any, str] | None:
    """torch's rules, plus functions matched through ``torch_fn`` by their name."""
    hit = torch_keys(node, wanted)
    if hit is not None:
        return hit
    torch_fn = node.meta.get("torch_fn")
    if torch_fn is None:
        return None
    call, described = torch_fn
    fn_name = described.split(".")[-1]
    for src in wanted:
        if (
            callable(src)
            and not isinstance(src, type)
            and getattr(src, "__name__", None) == fn_name
        ):
            return src, call
    return None


def _param_placeholders(target: Any) -> set[str]:
    if not isinstance(target, torch.export.ExportedProgram):
        return set()
    sig = target.graph_signature
    return (
        set(sig.inputs_to_parameters)
        | set(sig.inputs_to_buffers)
        | set(getattr(sig, "inputs_to_lifted_tensor_constants", {}))
    )


def _make_partition(
    nodes: list[fx.Node], source: Any, name: str, position: dict, param_names: set[str]
) -> SourcePartition:
    members = set(nodes)
    inputs: dict[fx.Node, None] = {}
    params: dict[fx.Node, None] = {}
    outputs: list[fx.Node] = []
    for node in nodes:
        for arg in node.args:
            if not isinstance(arg, fx.Node) or arg in members:
                continue
            if arg.op == "get_attr" or (arg.op == "placeholder" and arg.name in param_names):
                params[arg] = None
            else:
                inputs[arg] = None
        if node.op == "get_attr":
            params[node] = None
            continue
        if any(u not in members for u in node.users):
            outputs.append(node)
    return SourcePartition(
        nodes,
        source,
        sorted(inputs, key=position.__getitem__),
        outputs,
        sorted(params, key=position.__getitem__),
        name,
    )


def group_by_source(
    graph: fx.Graph,
    wanted_sources: Sequence[Any],
    filter_fn: Callable[[fx.Node], bool] | None,
    keys: Callable[[fx.Node, Sequence[Any]], tuple[Any, str] | None],
    param_names: Iterable[str] = (),
) -> dict[Any, list[SourcePartition]]:
    """The grouping both :func:`source_partitions` and torch's drop-in use."""
    groups: dict[Any, dict[str, list[fx.Node]]] = {}
    position = {}
    for i, node in enumerate(graph.nodes):
        position[node] = i
        hit = keys(node, wanted_sources)
        if hit is not None:
            source, name = hit
            groups.setdefault(source, {}).setdefault(name, []).append(node)
    param_names = set(param_names)
    out: dict[Any, list[SourcePartition]] = {}
    for source, by_name in groups.items():
        parts = [
            _make_partition(nodes, source, name, position, param_names)
            for name, nodes in by_name.items()
            if filter_fn is None or all(map(filter_fn, nodes))
        ]
        out[source] = parts
    return out


def source_partitions(
    target: fx.GraphModule | fx.Graph | torch.export.ExportedProgram,
    wanted_sources: Sequence[Any],
    *,
    filter_fn: Callable[[fx.Node], bool] | None = None,
) -> dict[Any, list[SourcePartition]]:
    """Map each wanted source to the partitions of nodes that came from it.

    >>> parts = source_partitions(ep, [torch.nn.Linear])         # doctest: +SKIP
    >>> [p.name for p in parts[torch.nn.Linear]][:2]             # doctest: +SKIP
    ['layers.0.self_attn.q_proj', 'layers.0.self_attn.k_proj']

    ``filter_fn`` drops partitions with a node it rejects. Sources with no partition are
    absent from the result.
    """
    _, graph = module_and_graph(target, "source_partitions")
    if isinstance(wanted_sources, (type, str)) or callable(wanted_sources):
        wanted_sources = [wanted_sources]
    return group_by_source(
        graph, list(wanted_sources), filter_fn, _fxpass_keys, _param_placeholders(target)
    )


def check_subgraphs_connected(subgraph1: SourcePartition, subgraph2: SourcePartition) -> bool:
    """Whether a node of ``subgraph2`` uses a node of ``subgraph1`` (torch's helper)."""
    second = set(subgraph2.nodes)
    return any(user in second for node in reversed(subgraph1.nodes) for user in node.users)
