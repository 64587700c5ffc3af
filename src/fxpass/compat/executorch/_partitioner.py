"""fxpass's partitioners as ExecuTorch ``Partitioner`` objects: what they choose is delegated.

Each class cuts an Edge program with one of fxpass's partitioners, tags the chosen nodes
(``node.meta["delegation_tag"]``), tags the parameters, buffers and constants only they read,
and returns ExecuTorch's ``PartitionResult`` with a ``DelegationSpec`` (backend id and compile
specs) per tag, so ``to_edge_transform_and_lower(..., partitioner=[...])`` or
``EdgeProgramManager.to_backend(...)`` lowers them to the backend:

* :class:`CapabilityPartitioner` — the largest cycle-free groups of nodes an operator support
  accepts (``"ops(aten.convolution, aten.relu) & dtype(f32)"``, see
  :mod:`fxpass.partition.support`; ATen op names match the Edge ops);
* :class:`PatternPartitioner` — pattern matches plus supported ops
  (ExecuTorch's ``generate_pattern_op_partitions``);
* :class:`SourcePartitioner` — whole module instances or calls (``torch.nn.Linear``).

The ops a support names that ``to_edge`` would decompose (``aten.linear``) are reported by
``ops_to_not_decompose`` with the support as the filter, so the backend receives them whole.

>>> partitioner = CapabilityPartitioner("ops(aten.linear, aten.relu)", "XnnpackBackend")  # doctest: +SKIP
>>> lowered = to_edge_transform_and_lower(ep, partitioner=[partitioner])                  # doctest: +SKIP
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from executorch.exir.backend.backend_details import BackendDetails
from executorch.exir.backend.compile_spec_schema import CompileSpec
from executorch.exir.backend.partitioner import DelegationSpec, Partitioner, PartitionResult
from executorch.exir.backend.utils import tag_constant_data
from torch import fx
from torch.export import ExportedProgram

from ...fxutil.ops import schema_of
from ...partition.base import Partition, find_cycle
from ...partition.capability import capability_partitions
from ...partition.source import source_partitions
from ...partition.support import OperatorSupportBase, parse_support

__all__ = [
    "CapabilityPartitioner",
    "DelegationSpec",
    "PartitionResult",
    "PatternPartitioner",
    "SourcePartitioner",
]

#: Where the backends ExecuTorch ships register themselves, by backend id.
_BACKEND_MODULES = {"XnnpackBackend": "executorch.backends.xnnpack.xnnpack_preprocess"}


def _backends() -> set[str]:
    return {cls.__name__ for cls in BackendDetails.__subclasses__()}


def _require_backend(backend_id: str) -> None:
    if backend_id in _backends():
        return
    module = _BACKEND_MODULES.get(backend_id)
    if module is not None:
        importlib.import_module(module)
        if backend_id in _backends():
            return
    known = ", ".join(sorted(_backends())) or "none"
    raise ValueError(
        f"no ExecuTorch backend '{backend_id}' is loaded (loaded: {known}); import the "
        "backend's package first (e.g. executorch.backends.xnnpack for 'XnnpackBackend')"
    )


def _decomposed(op: Any) -> bool:
    """Whether ``to_edge`` would take ``op`` apart: a functional op outside core ATen."""
    schema = schema_of(op)
    if schema is None or torch.Tag.core in getattr(op, "tags", ()) or schema.is_mutable:
        return False
    return all(r.alias_info is None for r in schema.returns)


class _FxpassPartitioner(Partitioner):
    """Tags what :meth:`propose` returns for one backend."""

    def __init__(
        self,
        backend_id: str,
        compile_specs: Iterable[CompileSpec] = (),
        support: OperatorSupportBase | Any = None,
    ) -> None:
        super().__init__()
        if not isinstance(backend_id, str) or not backend_id:
            raise TypeError(
                f"backend_id is the name of an ExecuTorch backend such as 'XnnpackBackend', "
                f"not {backend_id!r}"
            )
        _require_backend(backend_id)
        self.backend_id = backend_id
        self.delegation_spec = DelegationSpec(backend_id, list(compile_specs))
        self.support = None if support is None else parse_support(support)

    def propose(self, exported_program: ExportedProgram) -> list[Partition]:
        raise NotImplementedError

    def partition(self, exported_program: ExportedProgram) -> PartitionResult:
        """Tag the proposed partitions (``tag0``, ``tag1``, ...) and the constants only they
        read; return the program with a ``DelegationSpec`` per tag."""
        partitions = [p for p in self.propose(exported_program) if len(p)]
        tags: dict[str, DelegationSpec] = {}
        for i, part in enumerate(partitions):
            tag = f"tag{i}"
            for node in part.nodes:
                node.meta["delegation_tag"] = tag
            tags[tag] = self.delegation_spec
        tag_constant_data(exported_program)
        return PartitionResult(tagged_exported_program=exported_program, partition_tags=tags)

    def ops_to_not_decompose(
        self, ep: ExportedProgram
    ) -> tuple[list[torch._ops.OpOverload], Callable[[fx.Node], bool] | None]:
        """The non-core ATen ops the support names (``to_edge`` would decompose them), and
        the support as the per-node filter."""
        if self.support is None:
            return [], None
        keep = sorted(filter(_decomposed, self.support.named_ops()), key=str)
        if not keep:
            return [], None
        support = self.support
        return keep, lambda node: bool(support.is_node_supported({}, node))

    def __repr__(self) -> str:
        what = f", {self.support.describe()!r}" if self.support is not None else ""
        return f"{type(self).__name__}({self.backend_id!r}{what})"


class CapabilityPartitioner(_FxpassPartitioner):
    """Delegate the largest cycle-free groups of nodes ``support`` accepts to ``backend_id``.

    Args:
        support: an operator support or spec (``"ops(aten.add, aten.mul) & dtype(f32)"``).
        backend_id: the backend's name (``"XnnpackBackend"``).
        compile_specs: the backend's ``CompileSpec`` objects, one list for every partition.
        allows_single_node_partition: delegate partitions of one compute node too.
        non_compute_ops, horizontal: as :func:`fxpass.partition.capability_partitions`.
    """

    def __init__(
        self,
        support: OperatorSupportBase | Any,
        backend_id: str,
        compile_specs: Iterable[CompileSpec] = (),
        *,
        allows_single_node_partition: bool = True,
        non_compute_ops: Sequence[Any] | None = None,
        horizontal: bool = True,
    ) -> None:
        super().__init__(backend_id, compile_specs, support)
        self.allows_single_node_partition = allows_single_node_partition
        self.non_compute_ops = non_compute_ops
        self.horizontal = horizontal

    def propose(self, exported_program: ExportedProgram) -> list[Partition]:
        return capability_partitions(
            exported_program,
            self.support,
            allows_single_node_partition=self.allows_single_node_partition,
            non_compute_ops=self.non_compute_ops,
            horizontal=self.horizontal,
        )


class PatternPartitioner(_FxpassPartitioner):
    """Delegate pattern matches and the nodes ``op_support`` accepts, merged into maximal
    cycle-free partitions (see :func:`fxpass.partition.from_patterns`)."""

    def __init__(
        self,
        patterns: Iterable[Any],
        backend_id: str,
        compile_specs: Iterable[CompileSpec] = (),
        *,
        op_support: OperatorSupportBase | Any = None,
        ignore_literals: bool = False,
    ) -> None:
        super().__init__(backend_id, compile_specs, op_support)
        self.patterns = list(patterns)
        self.ignore_literals = ignore_literals

    def propose(self, exported_program: ExportedProgram) -> list[Partition]:
        from ...partition.from_patterns import pattern_partitions  # needs the rewrite engine

        return pattern_partitions(
            exported_program,
            self.patterns,
            self.support,
            ignore_literals=self.ignore_literals,
        )


class SourcePartitioner(_FxpassPartitioner):
    """Delegate every instance of the given modules or calls of the given functions
    (``torch.nn.Linear``, ``torch.nn.functional.silu``), each as one partition; with a
    ``support``, only instances whose every node it accepts."""

    def __init__(
        self,
        sources: Sequence[Any],
        backend_id: str,
        compile_specs: Iterable[CompileSpec] = (),
        *,
        support: OperatorSupportBase | Any = None,
    ) -> None:
        super().__init__(backend_id, compile_specs, support)
        self.sources = list(sources)

    def propose(self, exported_program: ExportedProgram) -> list[Partition]:
        gm = exported_program.graph_module
        modules = dict(gm.named_modules())
        support = self.support
        found = source_partitions(exported_program, self.sources)
        parts = []
        for source in self.sources:
            for part in found.get(source, ()):
                nodes = [n for n in part.nodes if n.op == "call_function"]
                if support is None or all(support.is_node_supported(modules, n) for n in nodes):
                    parts.append(Partition(len(parts), nodes))
        cycle = find_cycle(parts)
        if cycle is not None:
            raise ValueError(
                f"source partitions {cycle} depend on each other through nodes outside them; "
                "delegate fewer sources, or use CapabilityPartitioner"
            )
        return parts
