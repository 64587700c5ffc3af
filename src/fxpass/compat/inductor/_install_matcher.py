"""``install()``: code importing ``torch._inductor.pattern_matcher`` gets fxpass's objects.

After :func:`install`, ``import torch._inductor.pattern_matcher`` (and ``from ... import
register_replacement``, ``PatternMatcherPass``...) gives a module whose pattern-matcher names
are fxpass's and whose other names are Inductor's own, so a pass file written for Inductor
(vLLM's, TensorRT-LLM AutoDeploy's) runs unmodified on fxpass. Inductor's own passes are
loaded first and keep Inductor's objects: only code imported afterwards is redirected, and
a ``PatternMatcherPass`` it installs at Inductor's post-grad hooks runs inside
``torch.compile``. :func:`uninstall` (or leaving ``with installed():``) puts Inductor's
module back; objects imported meanwhile stay fxpass's.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import pkgutil
import sys
import types
from collections.abc import Iterator
from typing import Any

__all__ = ["install", "installed", "is_installed", "uninstall"]

log = logging.getLogger(__name__)

NAME = "torch._inductor.pattern_matcher"
_STATE: dict[str, Any] = {}


def _drop_in() -> dict[str, Any]:
    from . import _DROP_IN

    return _DROP_IN


def _load_inductor() -> types.ModuleType:
    """Import Inductor and every module of it that takes names from its pattern matcher,
    so that they keep Inductor's objects."""
    original = importlib.import_module(NAME)
    for name in ("torch._inductor.compile_fx", "torch._inductor.graph"):
        importlib.import_module(name)
    import torch._inductor.fx_passes as passes

    for info in pkgutil.walk_packages(passes.__path__, passes.__name__ + "."):
        try:
            importlib.import_module(info.name)
        except Exception as e:  # broad: its optional backend (mkldnn, distributed) is missing here
            log.debug("not importing %s: %s", info.name, e)
    return original


def install(*, improve: bool | None = None) -> types.ModuleType:
    """Make ``torch._inductor.pattern_matcher`` fxpass's (see the module docstring); returns
    the module now there. ``improve`` also sets :func:`set_improvements`. Installing twice
    is harmless."""
    from ._options import set_improvements

    if improve is not None:
        set_improvements(improve)
    if _STATE:
        return _STATE["facade"]
    original = _load_inductor()
    facade = types.ModuleType(NAME, original.__doc__)
    facade.__dict__.update(
        {k: v for k, v in vars(original).items() if k not in ("__name__", "__doc__")}
    )
    facade.__dict__.update(_drop_in())
    facade.__fxpass__ = True  # type: ignore[attr-defined]
    import torch._inductor as package

    _STATE.update(original=original, facade=facade)
    sys.modules[NAME] = facade
    package.pattern_matcher = facade  # type: ignore[attr-defined]
    return facade


def uninstall() -> None:
    """Put Inductor's own ``torch._inductor.pattern_matcher`` back."""
    if not _STATE:
        return
    import torch._inductor as package

    original = _STATE["original"]
    sys.modules[NAME] = original
    package.pattern_matcher = original  # type: ignore[attr-defined]
    _STATE.clear()


def is_installed() -> bool:
    """Whether :func:`install` is in effect."""
    return bool(_STATE)


@contextlib.contextmanager
def installed(*, improve: bool | None = None) -> Iterator[types.ModuleType]:
    """``with installed():`` — fxpass's pattern matcher inside the block, Inductor's after it
    (and the improvements setting as it was)."""
    from ._options import improvements_on, set_improvements

    was, before = is_installed(), improvements_on()
    module = install(improve=improve)
    try:
        yield module
    finally:
        if not was:
            uninstall()
        set_improvements(before)
