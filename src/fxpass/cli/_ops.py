"""Which ops a program needs, and who registers them: what ``fxpass show`` prints, so
whoever receives a program knows what its consumer must import (or that ``--portable``
writes it without fxpass's ops)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

from ..fxutil.ops import op_registrar

#: Namespaces torch registers itself (in C++, or when ``import torch`` runs).
_TORCH = frozenset({"aten", "prims", "prim", "_c10d_functional", "c10d_functional", "_c10d"})


@dataclass
class Namespace:
    """The ops of one namespace that a program calls, and where they come from."""

    name: str
    ops: list[str]
    registered_by: str
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"ops": self.ops, "registered_by": self.registered_by, "note": self.note}

    def line(self) -> str:
        shown = ", ".join(self.ops) if len(self.ops) <= 4 else f"{len(self.ops)} ops"
        note = f" ({self.note})" if self.note else ""
        return f"  {self.name}: {shown} - {self.registered_by}{note}"


def needed_ops(gm: fx.GraphModule) -> list[Namespace]:
    """The op namespaces ``gm`` calls (``torch.ops.<ns>``), each with its ops and registrar."""
    by_ns: dict[str, dict[str, Any]] = defaultdict(dict)
    for node in gm.graph.nodes:
        target = node.target
        if node.op == "call_function" and isinstance(target, torch._ops.OpOverload):
            by_ns[target.namespace].setdefault(target._opname, target)
    out = []
    for ns in sorted(by_ns, key=lambda n: (n != "aten", n)):
        ops = by_ns[ns]
        out.append(Namespace(ns, sorted(ops), *_registrar(ns, next(iter(ops.values())))))
    return out


def _registrar(ns: str, op: Any) -> tuple[str, str]:
    module = op_registrar(op)
    if ns == "fxpass":
        return (
            f"fxpass ({module or 'fxpass.ops'})",
            "its torch plug-in loads it wherever fxpass is installed; fxpass run --portable "
            "writes torch's own ops instead",
        )
    if module is not None:
        return module, f"import it before torch.export.load; fxpass: --import {module}"
    if ns in _TORCH:
        return "torch", ""
    return "a C++ library (torch.ops.load_library)", ""
