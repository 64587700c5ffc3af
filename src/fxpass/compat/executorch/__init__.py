"""ExecuTorch's pass infrastructure on fxpass: change one import, keep your passes — or
call :func:`install` first and ExecuTorch's own lowering runs on it too.

``from executorch.exir.pass_base import ExportPass`` becomes
``from fxpass.compat.executorch import ExportPass`` (likewise ``ProxyValue``,
``NodeMetadata``, ``PassResult``, ``ExportPassBaseError``, ``ExportedProgramPassBase``,
``ExportedProgramPassResult``, and ``PassManager`` / ``ExportedProgramPassManager`` from
``executorch.exir.pass_manager``). The hooks, graphs and node metadata are ExecuTorch's;
nodes a pass leaves alone are not re-run on fake tensors, failing passes leave the module as
it was, and "modified" is honest.

:func:`install` (before ExecuTorch is imported) makes ``executorch.exir.pass_base`` and
``executorch.exir.pass_manager`` hand out these classes, so every pass ExecuTorch and its
backends define — and ``to_edge_transform_and_lower`` itself — runs on fxpass;
:func:`uninstall` undoes it (see :mod:`fxpass.compat.executorch._install`).

:class:`CapabilityPartitioner`, :class:`PatternPartitioner` and :class:`SourcePartitioner`
are fxpass's partitioners as ExecuTorch ``Partitioner`` objects: the nodes they choose are
delegated to a backend (``"XnnpackBackend"``). See docs/executorch.md.

Importing this package imports nothing of ExecuTorch (each name loads its module when first
used), so :func:`install` can run before ExecuTorch is imported, and the package can be
imported at any point of ExecuTorch's own import. Needs the ``executorch`` package
(``pip install executorch==1.5.1``, or ``pip install -e '.[executorch]'`` from fxpass's
checkout).
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

from ._install import Installation, install, is_installed, uninstall


def _find_executorch() -> None:
    """Fail now, with the install hint, where ExecuTorch is missing (imports nothing of it)."""
    try:
        found = importlib.util.find_spec("executorch") is not None
        problem = "no module named 'executorch'"
    except (ImportError, ValueError) as e:
        found, problem = False, str(e)
    if not found:
        raise ModuleNotFoundError(
            "fxpass.compat.executorch needs ExecuTorch: pip install executorch==1.5.1 (the "
            "release built for torch 2.13; from fxpass's checkout: pip install -e "
            f"'.[executorch]') ({problem})",
            name="executorch",
        )


_find_executorch()

if TYPE_CHECKING:
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

#: the module each public name lives in, loaded on first use
_HOMES = {
    "CapabilityPartitioner": "_partitioner",
    "DelegationSpec": "_partitioner",
    "PartitionResult": "_partitioner",
    "PatternPartitioner": "_partitioner",
    "SourcePartitioner": "_partitioner",
    "ExportedProgramPassBase": "_pass_base",
    "ExportedProgramPassResult": "_pass_base",
    "ExportPass": "_pass_base",
    "ExportPassBaseError": "_pass_base",
    "NodeMetadata": "_pass_base",
    "PassResult": "_pass_base",
    "ProxyValue": "_pass_base",
    "map_args": "_pass_base",
    "ExportedProgramPassManager": "_pass_manager",
    "PassManager": "_pass_manager",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    # ExecuTorch's pass base first: while install() is in effect, importing it is what makes
    # fxpass's modules (which must not be half-imported at that moment)
    importlib.import_module("executorch.exir.pass_base")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value  # the next lookup does not come here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})


__all__ = [
    "CapabilityPartitioner",
    "DelegationSpec",
    "ExportPass",
    "ExportPassBaseError",
    "ExportedProgramPassBase",
    "ExportedProgramPassManager",
    "ExportedProgramPassResult",
    "Installation",
    "NodeMetadata",
    "PartitionResult",
    "PassManager",
    "PassResult",
    "PatternPartitioner",
    "ProxyValue",
    "SourcePartitioner",
    "install",
    "is_installed",
    "map_args",
    "uninstall",
]
