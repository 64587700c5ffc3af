"""ExecuTorch's own passes on fxpass: :func:`install` swaps the base classes process-wide.

ExecuTorch's passes (its Edge passes, XNNPACK's, Arm's, ...) are written as
``class SomePass(ExportPass)`` with ``ExportPass`` from ``executorch.exir.pass_base``, and
its lowering runs them through ``ExportedProgramPassManager`` from
``executorch.exir.pass_manager``. A class's base is fixed when the class statement runs, so
the swap must happen before those modules define their passes, that is, before ExecuTorch
is imported::

    import fxpass.compat.executorch as fxet

    fxet.install()                        # first: nothing of ExecuTorch is imported yet
    from executorch.exir import to_edge_transform_and_lower   # its passes now run on fxpass

:func:`install` puts an import hook on ``sys.meta_path``: the moment one of these ExecuTorch
modules has run, and before the module that imported it reads anything from it, fxpass puts
its own objects in (:data:`_SWAPS`):

* ``pass_base.ExportPass`` and ``pass_manager.PassManager`` / ``ExportedProgramPassManager``:
  fxpass's classes;
* ``lowered_backend_module.legalize_graph``: the same order, made in place
  (:mod:`._fusion`);
* ``backend_api``'s loops over partitions: ExecuTorch's own, recompiling the program once;
* the Edge verifier's dtype check: ExecuTorch's, run once per graph shape that passed
  (:mod:`._verified`);
* torch's ``ReplaceViewOpsWithViewCopyOpsPass``, which ``to_edge`` runs: the same pass on
  fxpass's ``ExportPass`` (:mod:`._view_copy`).
* XNNPACK's ``ConvertToUpsampleBilinear2d`` and ``ConvertToSDPAPass``: their pattern graphs
  built only for a graph that could hold them (:mod:`._patterns`; on the releases it was
  checked on).

Everything else in those modules (``ProxyValue``, ``NodeMetadata``, ``PassResult``, the
errors) stays ExecuTorch's, as fxpass's classes use them.

:func:`uninstall` (or leaving ``with install():``) removes the hook and puts ExecuTorch's
classes back into its modules: code that asks for ``executorch.exir.pass_base.ExportPass``
from then on gets ExecuTorch's. Pass classes defined while installed keep fxpass's base
(Python cannot re-parent classes whose instances already exist — ExecuTorch keeps some in
module-level lists); ExecuTorch's lowering runs entirely on its own classes again only in a
process that never installed (a fresh interpreter).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Callable
from typing import Any

__all__ = ["Installation", "install", "is_installed", "uninstall"]

_PASS_BASE = "executorch.exir.pass_base"


def _fxpass_module(name: str, needs: tuple[str, ...]) -> types.ModuleType:
    """fxpass's module ``name`` (imported now, while ExecuTorch is being imported)."""
    half = sys.modules.get(name)
    if half is not None and not all(hasattr(half, n) for n in needs):
        raise ImportError(
            f"{name} is being imported and imports ExecuTorch, which needs it complete: "
            "with install() in effect, import ExecuTorch (or use fxpass.compat.executorch's "
            "public names) before importing fxpass's private ExecuTorch modules"
        )
    return importlib.import_module(name)


def _pass_base(module: types.ModuleType) -> dict[str, Any]:
    ours = _fxpass_module("fxpass.compat.executorch._pass_base", ("ExportPass",))
    return {"ExportPass": ours.ExportPass}


def _pass_manager(module: types.ModuleType) -> dict[str, Any]:
    names = ("PassManager", "ExportedProgramPassManager")
    ours = _fxpass_module("fxpass.compat.executorch._pass_manager", names)
    return {name: getattr(ours, name) for name in names}


def _backend_api(module: types.ModuleType) -> dict[str, Any]:
    from ._fusion import one_recompile

    names = ("_create_partitions_in_graph_module", "_partition_and_lower_one_graph_module")
    return {name: one_recompile(getattr(module, name)) for name in names}


def _lowered_backend_module(module: types.ModuleType) -> dict[str, Any]:
    from ._fusion import legalize_graph

    return {"legalize_graph": legalize_graph}


def _verifier(module: types.ModuleType) -> dict[str, Any]:
    from ._verified import arg_validator, dtype_check

    name = "_check_tensor_args_matching_op_allowed_dtype"
    return {
        name: dtype_check(getattr(module, name)),
        "EdgeOpArgValidator": arg_validator(module.EdgeOpArgValidator),
    }


def _view_copy(module: types.ModuleType) -> dict[str, Any]:
    name = "ReplaceViewOpsWithViewCopyOpsPass"
    ours = _fxpass_module("fxpass.compat.executorch._view_copy", (name,))
    return {name: getattr(ours, name)}


def _pattern_getter(module: types.ModuleType) -> dict[str, Any]:
    from ._patterns import NEEDS, known_release, withheld

    if not known_release():
        return {}
    (patterns,) = [p for p in NEEDS.values() if p.graphs == module.__name__]
    return {patterns.getter: withheld(getattr(module, patterns.getter), patterns.empty)}


def _pattern_pass(module: types.ModuleType) -> dict[str, Any]:
    from ._patterns import NEEDS, known_release, lazy_patterns

    if not known_release():
        return {}
    patterns = NEEDS[module.__name__]
    call = getattr(module, patterns.cls).call
    return {f"{patterns.cls}.call": lazy_patterns(call, patterns.needs)}


_XNNPACK = "executorch.backends.xnnpack"

#: ExecuTorch's modules, and what fxpass puts into each once it has run (``"Class.name"``:
#: an attribute of a class of the module)
_SWAPS: dict[str, Callable[[types.ModuleType], dict[str, Any]]] = {
    _PASS_BASE: _pass_base,
    "executorch.exir.pass_manager": _pass_manager,
    "executorch.exir.backend.backend_api": _backend_api,
    "executorch.exir.lowered_backend_module": _lowered_backend_module,
    "executorch.exir.verification.verifier": _verifier,
    "executorch.exir.program._program": _view_copy,
    "executorch.exir.capture._capture": _view_copy,
    f"{_XNNPACK}.partition.graphs.bilinear_2d": _pattern_getter,
    f"{_XNNPACK}.partition.graphs.sdpa": _pattern_getter,
    f"{_XNNPACK}._passes.convert_to_upsample_bilinear2d": _pattern_pass,
    f"{_XNNPACK}._passes.convert_to_sdpa": _pattern_pass,
}


class _SwapAfterExec(importlib.abc.Loader):
    """Runs a module with its own loader, then swaps the names (before anyone reads them)."""

    def __init__(self, loader: importlib.abc.Loader, swap: Callable[[types.ModuleType], None]):
        self._loader = loader
        self._swap = swap

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self._loader.exec_module(module)
        self._swap(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_code, ... of the real loader
        return getattr(self._loader, name)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds the ExecuTorch modules in :data:`_SWAPS` as the other finders do, and wraps their
    loaders so that fxpass's objects replace ExecuTorch's once each module has run."""

    def find_spec(
        self, fullname: str, path: Any = None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _SWAPS:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _SwapAfterExec(spec.loader, _swap)
                return spec
        return None


class Installation:
    """What :func:`install` returns: leaving ``with install():`` uninstalls."""

    def __enter__(self) -> Installation:
        return self

    def __exit__(self, *exc: object) -> None:
        uninstall()

    def __repr__(self) -> str:
        state = "installed" if is_installed() else "uninstalled"
        return f"<fxpass.compat.executorch installation ({state})>"


_FINDER: _Finder | None = None
_ORIGINALS: dict[tuple[str, str], Any] = {}  # (module, name) -> ExecuTorch's object


def _owner(module: types.ModuleType, name: str) -> tuple[Any, str]:
    """Where ``name`` (``"f"`` or ``"Class.f"``) of ``module`` is set: object and attribute."""
    *path, attribute = name.split(".")
    owner: Any = module
    for part in path:
        owner = getattr(owner, part)
    return owner, attribute


def _swap(module: types.ModuleType) -> None:
    """Put fxpass's objects into ExecuTorch's ``module`` (which has just run)."""
    for name, ours in _SWAPS[module.__name__](module).items():
        owner, attribute = _owner(module, name)
        _ORIGINALS.setdefault((module.__name__, name), getattr(owner, attribute))
        setattr(owner, attribute, ours)


def _defined_too_early(module: types.ModuleType) -> list[str]:
    """ExecuTorch's passes already defined on its own ``ExportPass``."""
    base = _ORIGINALS.get((module.__name__, "ExportPass"), module.ExportPass)
    early, todo = [], list(base.__subclasses__())
    while todo:
        cls = todo.pop()
        early.append(f"{cls.__module__}.{cls.__qualname__}")
        todo.extend(cls.__subclasses__())
    return sorted(early)


def install() -> Installation:
    """Make ExecuTorch hand out fxpass's ``ExportPass``, ``PassManager`` and
    ``ExportedProgramPassManager`` from its own modules, process-wide (and fuse partitions
    with one recompile, see the module's doc).

    Call it before ExecuTorch is imported. Calling it again while installed does nothing.
    Raises ``RuntimeError`` if ExecuTorch's ``pass_base`` was already imported and passes were
    defined on its ``ExportPass`` (they would keep ExecuTorch's base).
    """
    global _FINDER
    if _FINDER is not None:
        return Installation()
    loaded = sys.modules.get(_PASS_BASE)
    if loaded is not None and hasattr(loaded, "ExportPass"):
        early = _defined_too_early(loaded)
        if early:
            passes = f"{len(early)} passes are" if len(early) > 1 else "1 pass is"
            raise RuntimeError(
                "fxpass.compat.executorch.install() must run before ExecuTorch is imported: "
                f"{passes} already defined on ExecuTorch's own ExportPass (e.g. {early[0]}); "
                "call install() first thing in the process (before `import executorch...`), "
                "or in a fresh interpreter"
            )
    _FINDER = _Finder()
    sys.meta_path.insert(0, _FINDER)
    for name in _SWAPS:  # already imported (without passes on them yet): swap now
        module = sys.modules.get(name)
        spec = getattr(module, "__spec__", None)
        if spec is not None and not getattr(spec, "_initializing", False):
            _swap(module)
    return Installation()


def uninstall() -> None:
    """Undo :func:`install`: remove the import hook and give ExecuTorch's modules their own
    classes back. Passes defined while installed keep fxpass's base (see the module's doc).
    Does nothing when not installed."""
    global _FINDER
    if _FINDER is None:
        return
    if _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)
    _FINDER = None
    for (module_name, name), original in _ORIGINALS.items():
        module = sys.modules.get(module_name)
        if module is not None:
            setattr(*_owner(module, name), original)
    _ORIGINALS.clear()


def is_installed() -> bool:
    """Whether :func:`install` is in effect."""
    return _FINDER is not None
