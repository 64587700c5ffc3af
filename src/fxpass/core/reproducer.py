"""Crash reproducers: when a pass fails, write what it takes to make it fail again.

Attach :class:`CrashReproducer` to a run (``pipeline.run(gm, instrument=[CrashReproducer()])``
or ``fxpass run ... --reproducer DIR``). When a pass raises or a check fails, it writes a
folder with

* ``input.fxgraph`` — the graph as the pipeline received it (after the rollback, so exactly the
  input), with the sample inputs; see :mod:`fxpass.core.serialize`;
* ``pipeline.txt`` — the pipeline spec;
* ``error.txt`` — the error and its traceback;
* ``README.txt`` — the one command that reproduces the failure:
  ``python -m fxpass repro <folder>``;
* ``imports.txt`` — the modules the run imported first (``--import``), when there were any.

and adds that command to the :class:`~fxpass.PassFailedError` message. ``pipeline.txt`` names
every user pass by an importable ``module:qualname`` reference (:func:`importable_spec`), so
the command works in a fresh process run from the same folder; passes that have no such name
(lambdas, local functions) are listed in ``README.txt``.
"""

from __future__ import annotations

import inspect
import os
import shlex
import shutil
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..fxutil.messages import first_line
from .contract import FunctionPass, ObjectPass, Pass, PassResult
from .errors import FxpassError, PassFailedError, SpecError
from .imports import cwd_on_path, import_modules, resolve_import
from .instrument import Instrumentation
from .pass_registry import REGISTRY
from .pipeline import Pipeline
from .serialize import load_graph, save_graph
from .spec import parse_spec

__all__ = ["CrashReproducer", "importable_spec", "load_reproducer", "run_reproducer"]


# ----- a spec another process can run --------------------------------------------------------
def importable_spec(pipeline: Any) -> tuple[str, list[str]]:
    """``pipeline`` as spec text that a fresh process can parse, and the passes it cannot name.

    fxpass's own passes and plug-ins keep their registered names (every process has them).
    Every user pass becomes an importable ``module:qualname`` reference: a registered
    function or ``Pass`` class by where it is defined (with its options), a rule set, pass
    object or ``Pipeline`` by the module-level name that holds it. A pass with no such name
    (a lambda, a local function, an object made inside a function, anything in
    ``__main__``) is listed as unnamed and keeps its bare name."""
    unnamed: list[str] = []
    body = ",".join(_render(p, unnamed) for p in pipeline.passes)
    return body, unnamed


def _render(p: Pass, unnamed: list[str]) -> str:
    if isinstance(p, Pipeline):
        if not _has_user_pass(p):
            return p.spec
        own = p.written_as
        if own is None or ":" in own.split("(", 1)[0]:
            ref = _global_ref(p)
            if ref is not None:
                return ref
        body = ",".join(_render(c, unnamed) for c in p.passes)
        return f"{_container_head(p)}({body})"
    spec = p.spec
    head = _head(spec)
    if head is not None and ":" in head[0]:
        return spec  # already a reference
    info = _registered(head[0]) if head is not None else None
    if info is not None and info.origin != "user":
        return spec
    ref = _object_ref(info.target) if info is not None else _pass_ref(p)
    if ref is None:
        unnamed.append(p.name)
        return spec
    return ref + (head[1] if head is not None else "")


def _container_head(p: Pipeline) -> str:
    """``fixpoint{...}`` or ``pipeline``: how a nested pipeline is written around its body."""
    own = p.written_as
    head = _head(own) if own else None
    if head is not None:
        info = _registered(head[0])
        if info is not None and info.takes_pipeline and info.origin != "user":
            return head[0] + head[1]
    return p.head


def _head(spec: str) -> tuple[str, str] | None:
    """(name, options text) of a one-element spec, None when it is not one."""
    try:
        elements = parse_spec(spec)
    except SpecError:
        return None
    if len(elements) != 1:
        return None
    el = elements[0]
    opts = "{" + " ".join(f"{o.key}={o.text}" for o in el.options) + "}" if el.options else ""
    return el.name, opts


def _registered(name: str) -> Any:
    return REGISTRY.get(name) if name in REGISTRY else None


def _has_user_pass(p: Any) -> bool:
    for c in getattr(p, "passes", ()):
        if isinstance(c, Pipeline):
            if _has_user_pass(c):
                return True
            continue
        head = _head(c.spec)
        info = _registered(head[0]) if head is not None else None
        if info is None or info.origin == "user":
            return True
    return False


def _pass_ref(p: Pass) -> str | None:
    """A reference for a pass made in code (not from the registry)."""
    if isinstance(p, FunctionPass):
        return _object_ref(p.fn)
    if isinstance(p, ObjectPass):
        return _global_ref(p.obj) or _class_ref(type(p.obj))
    return _global_ref(p) or _class_ref(type(p))


def _object_ref(obj: Any) -> str | None:
    """``module:qualname`` of a function or class that resolves back to ``obj``."""
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if module and qualname and module != "__main__" and "<" not in qualname:
        ref = f"{module}:{qualname}"
        try:
            if resolve_import(ref) is obj:
                return ref
        except Exception:  # broad: not importable under its own name: look for another below
            pass
    return _global_ref(obj)


def _class_ref(cls: type) -> str | None:
    """A Pass class whose instances need no arguments (``as_pass`` makes one)."""
    if cls.__module__.split(".")[0] == "fxpass":
        return None
    try:
        params = list(inspect.signature(cls).parameters.values())
    except (TypeError, ValueError):
        return None
    if any(
        q.default is q.empty and q.kind not in (q.VAR_POSITIONAL, q.VAR_KEYWORD) for q in params
    ):
        return None
    return _object_ref(cls)


def _global_ref(obj: Any) -> str | None:
    """``module:name`` of a module-level variable holding ``obj`` (its own module first)."""
    first = getattr(obj, "__module__", None) or getattr(type(obj), "__module__", None)
    names = [first] if first in sys.modules else []
    names += [n for n in list(sys.modules) if n != first]
    for name in names:
        if name == "__main__" or name.split(".")[0] in ("torch", "fxpass", "builtins"):
            continue
        module = sys.modules.get(name)
        for attr, value in list(getattr(module, "__dict__", {}).items()):
            if value is obj and not attr.startswith("__"):
                return f"{name}:{attr}"
    return None


class CrashReproducer(Instrumentation):
    """Write a reproducer folder under ``folder`` when a run fails (MLIR's crash reproducer)."""

    def __init__(
        self, folder: str | os.PathLike = "fxpass-reproducers", *, imports: Sequence[str] = ()
    ) -> None:
        self.folder = Path(folder)
        self.imports = list(imports)  # modules the run imported first (``--import``)
        self.written: list[Path] = []

    def after_pipeline(self, pipeline, gm, report, ctx):
        error: PassFailedError | None = ctx.error
        if error is None:
            return
        stamp = time.strftime("%Y%m%d-%H%M%S")
        name = "".join(c if c.isalnum() or c in "-_" else "_" for c in error.pass_name)
        target = self.folder / f"{stamp}-{name}"
        n = 1
        while target.exists():
            n += 1
            target = self.folder / f"{stamp}-{name}-{n}"
        try:
            self._write(target, pipeline, gm, ctx, error)
        except Exception as e:  # broad: reported on the error, which matters more than this one
            error.args = (f"{error.args[0]}\n  (no reproducer written: {type(e).__name__}: {e})",)
            return
        self.written.append(target)
        command = f"{shlex.quote(sys.executable)} -m fxpass repro {shlex.quote(str(target))}"
        error.with_reproducer(command)

    def _write(self, target: Path, pipeline, gm, ctx, error) -> None:
        """Fill a hidden folder beside ``target``, then rename it into place: a reproducer
        appears whole or not at all (the partial folder goes when writing fails)."""
        tmp = target.with_name(f".{target.name}.partial")
        tmp.mkdir(parents=True)
        try:
            self._fill(tmp, target, pipeline, gm, ctx, error)
            tmp.rename(target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    def _fill(self, tmp: Path, target: Path, pipeline, gm, ctx, error) -> None:
        save_graph(gm, tmp / "input.fxgraph", ctx.sample_inputs)
        spec, unnamed = importable_spec(pipeline)
        (tmp / "pipeline.txt").write_text(spec + "\n")
        if self.imports:
            (tmp / "imports.txt").write_text("\n".join(self.imports) + "\n")
        cause = error.__cause__ or error.cause
        tb = "".join(traceback.format_exception(type(cause), cause, cause.__traceback__))
        (tmp / "error.txt").write_text(f"{first_line(error)}\n\n{tb}")
        warning = (
            f"\nwarning: these passes have no importable name (define them, or the objects "
            f"that hold them, at module level of an importable module): {', '.join(unnamed)}\n"
            if unnamed
            else ""
        )
        (tmp / "README.txt").write_text(
            f"fxpass crash reproducer\n\npass '{error.pass_name}' failed:\n  "
            f"{first_line(error)}\n\nreproduce with:\n  python -m fxpass repro "
            f"{target}\n{warning}"
        )


def load_reproducer(folder: str | os.PathLike):
    """``(graph_module, sample_inputs, pipeline)`` from a reproducer folder.

    The modules in ``imports.txt`` are imported first, and passes named ``module:qualname``
    are imported from the current folder too (:mod:`fxpass.core.imports`)."""
    folder = Path(folder)
    if not (folder / "pipeline.txt").is_file() or not (folder / "input.fxgraph").is_file():
        raise FxpassError(
            f"{folder} is not an fxpass reproducer folder (it needs pipeline.txt and input.fxgraph)"
        )
    gm, inputs = load_graph(folder / "input.fxgraph")
    cwd_on_path()
    if (folder / "imports.txt").is_file():
        import_modules((folder / "imports.txt").read_text().split())
    spec = (folder / "pipeline.txt").read_text().strip()
    try:
        pipeline = Pipeline.parse(spec)
    except SpecError as e:
        raise FxpassError(
            f"cannot replay {folder}: {e.message} (its pipeline: {spec}); run it from the folder "
            "the original run imported its passes from, or name their modules with --import"
        ) from e
    return gm, inputs, pipeline


def run_reproducer(folder: str | os.PathLike) -> PassResult:
    """Run a reproducer: raises the same :class:`~fxpass.PassFailedError` as the original run."""
    gm, inputs, pipeline = load_reproducer(folder)
    return pipeline.run(gm, inputs)
