"""ExecuTorch's pass infrastructure on fxpass: change one import, keep your passes.

``from executorch.exir.pass_base import ExportPass`` becomes
``from fxpass.compat.executorch import ExportPass`` (likewise ``ProxyValue``,
``NodeMetadata``, ``PassResult``, ``ExportPassBaseError``, ``ExportedProgramPassBase``,
``ExportedProgramPassResult``, and ``PassManager`` / ``ExportedProgramPassManager`` from
``executorch.exir.pass_manager``). The hooks, graphs and node metadata are ExecuTorch's;
nodes a pass leaves alone are not re-run on fake tensors, failing passes leave the module as
it was, and "modified" is honest.

:class:`CapabilityPartitioner`, :class:`PatternPartitioner` and :class:`SourcePartitioner`
are fxpass's partitioners as ExecuTorch ``Partitioner`` objects: the nodes they choose are
delegated to a backend (``"XnnpackBackend"``). See docs/executorch.md.

Needs the ``executorch`` package (``pip install 'fxpass[executorch]'``).
"""

try:
    import executorch.exir  # noqa: F401
except ModuleNotFoundError as e:  # pragma: no cover - executorch is in the test extra
    raise ModuleNotFoundError(
        "fxpass.compat.executorch needs ExecuTorch: pip install 'fxpass[executorch]' "
        f"(importing it failed: {e})",
        name="executorch",
    ) from e

from ._partitioner import (
    CapabilityPartitioner,
    DelegationSpec,
    PartitionResult,
    PatternPartitioner,
    SourcePartitioner,
)
from ._pass_base import (
    ExportedProgramPassBase,
    ExportedProgramPassResult,
    ExportPass,
    ExportPassBaseError,
    NodeMetadata,
    PassResult,
    ProxyValue,
    map_args,
)
from ._pass_manager import ExportedProgramPassManager, PassManager

__all__ = [
    "CapabilityPartitioner",
    "DelegationSpec",
    "ExportPass",
    "ExportPassBaseError",
    "ExportedProgramPassBase",
    "ExportedProgramPassManager",
    "ExportedProgramPassResult",
    "NodeMetadata",
    "PartitionResult",
    "PassManager",
    "PassResult",
    "PatternPartitioner",
    "ProxyValue",
    "SourcePartitioner",
    "map_args",
]
