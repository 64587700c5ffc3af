"""fxpass's torch plug-in: programs that call ``torch.ops.fxpass`` load wherever fxpass is installed.

torch calls :func:`install` while it is being imported, for every package that declares an
entry point in the ``torch.backends`` group (``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` turns all
of them off). It imports nothing and registers nothing then: it only puts a ``fxpass``
namespace on ``torch.ops`` that imports :mod:`fxpass.ops` the first time one of its ops is
looked up, e.g. when ``torch.export.load`` reads a program that calls
``torch.ops.fxpass.rms_norm.default``. A process that never uses an fxpass op pays nothing
but this module (``bench/autoload.py`` measures it against a plain ``import torch``).

This module is deliberately outside the ``fxpass`` package: importing anything under
``fxpass`` would run ``fxpass/__init__.py`` (the whole library) during ``import torch``.
"""

from __future__ import annotations

import importlib
import sys
import warnings

__all__ = ["install"]

_NAMESPACE = "fxpass"
_state = {"started": False}


def _load_ops() -> None:
    """Import fxpass's ops once (re-entrant: defining them looks them up again)."""
    if _state["started"]:
        return
    _state["started"] = True
    try:
        importlib.import_module("fxpass.ops")
    except Exception as e:  # a lookup must fail as a lookup, but the user should see why
        warnings.warn(
            f"torch.ops.fxpass: importing fxpass to register its ops failed "
            f"({type(e).__name__}: {e})",
            RuntimeWarning,
            stacklevel=3,
        )


def install() -> None:
    """Give ``torch.ops`` a ``fxpass`` namespace that registers fxpass's ops on first use.

    Called by torch during ``import torch``; never raises (a failing plug-in would stop torch
    from importing), and does nothing when the namespace exists already."""
    try:
        torch = sys.modules["torch"]
        ops, base = torch.ops, torch._ops._OpNamespace
    except (KeyError, AttributeError):  # not called from torch, or torch's internals moved
        return
    if _NAMESPACE in vars(ops):
        return

    class _FxpassNamespace(base):
        """``torch.ops.fxpass``: imports :mod:`fxpass.ops` before the first op lookup."""

        def __getattr__(self, name: str):  # only called for ops not bound yet
            if not name.startswith("__"):
                _load_ops()
            return super().__getattr__(name)

    # torch names each op after its namespace's class module ("torch._ops.fxpass"); keep
    # torch's, or saved programs would name their ops after this module
    _FxpassNamespace.__module__ = base.__module__
    try:
        setattr(ops, _NAMESPACE, _FxpassNamespace(_NAMESPACE))
        ops._dir.append(_NAMESPACE)
    except Exception:  # pragma: no cover - torch changed how namespaces are kept
        return
