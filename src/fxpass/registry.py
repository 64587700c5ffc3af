"""fxpass's pass registry: ``fxpass.registry.names()``, ``.create(...)``, ``.pass_list(...)``.

The functions here act on the one registry fxpass uses (:data:`REGISTRY`); see
:mod:`fxpass.core.pass_registry` for the details.
"""

from __future__ import annotations

from .core.pass_registry import REGISTRY, PassInfo, PassList, Registry, register

__all__ = [
    "PassInfo",
    "PassList",
    "REGISTRY",
    "Registry",
    "create",
    "disable",
    "dump",
    "enable",
    "get",
    "is_enabled",
    "names",
    "pass_list",
    "register",
    "unregister",
]

names = REGISTRY.names
get = REGISTRY.get
create = REGISTRY.create
enable = REGISTRY.enable
disable = REGISTRY.disable
is_enabled = REGISTRY.is_enabled
pass_list = REGISTRY.pass_list
dump = REGISTRY.dump
unregister = REGISTRY.unregister
