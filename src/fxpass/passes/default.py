"""The default pipeline: the ``default`` pass list, which the demo, the backend and the CLI
run when given no spec. ``fxpass.registry.pass_list("default")`` edits it; the registered
pass ``default`` runs it as it stands.

The order, and why:

1. ``remove_assert_ops`` — export's ``_assert_tensor_metadata`` nodes hang off the norms'
   intermediate values and hide every norm from the fusions.
2. ``remove_detach``, ``remove_noop``, ``erase_copy`` — canonicalize: views, conversions,
   eval-mode dropouts and copies that change nothing would otherwise sit between the ops a
   fusion matches.
3. ``fuse_add_rmsnorm_quant``, ``fuse_add_rmsnorm``, ``fuse_rmsnorm`` — the most specific
   fusion first: add + norm + int8 quantization, then add + norm, then a lone norm.
4. ``cse``, ``dce`` — merge what the rewrites made identical, drop what they left unused.

Backend-specific passes (``repair_input_as_output``, ``scalar_to_tensor``,
``inplace_to_functional``, ``fix_functionalization``) are not in it: they lower a graph for a
particular runtime, and an ExportedProgram must stay functional.
"""

from __future__ import annotations

from ..core.pass_registry import REGISTRY
from .cleanup import (  # noqa: F401  (the passes the list names register on import)
    cse,
    dce,
    erase_copy,
    remove_assert_ops,
    remove_detach,
    remove_noop,
)
from .fusion import fuse_add_rmsnorm, fuse_add_rmsnorm_quant, fuse_rmsnorm  # noqa: F401

DEFAULT_PASSES: list[str] = [
    "remove_assert_ops",
    "remove_detach",
    "remove_noop",
    "erase_copy",
    "fuse_add_rmsnorm_quant",
    "fuse_add_rmsnorm",
    "fuse_rmsnorm",
    "cse",
    "dce",
]

for _name in DEFAULT_PASSES:
    REGISTRY.pass_list("default").insert(_name)
