"""TARGETs: what the commands work on, loaded without running code the user did not ask for.

A TARGET is

* a ``.pt2`` file (``torch.export.save``), loaded by ``torch.export.load`` with every pickle
  path closed: tensors load with ``torch.load(weights_only=True)``, and a file that needs
  anything else (pickled Python objects, which could run code) is refused;
* a ``.fxgraph`` file (:func:`fxpass.core.serialize.save_graph`), which holds no code;
* ``module:function`` — imports ``module`` (from the current folder too) and calls
  ``function()``, which returns ``(model, example_inputs)``, an ExportedProgram or a
  GraphModule. This runs that code, by the user's explicit request.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import sys
import types
import warnings
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._common import LOAD, USAGE, CliError

TARGET_HELP = "TARGET is a .pt2 file, a .fxgraph file, or module:function (see docs/cli.md)."


@dataclass
class Target:
    """A loaded TARGET: the program (ExportedProgram or GraphModule) and its user inputs."""

    text: str
    kind: str  # pt2 | fxgraph | python
    program: Any
    args: list[Any] | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)
    #: the user inputs once worked out (see ``_run.user_inputs``)
    inputs: list[Any] | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def is_exported(self) -> bool:
        import torch

        return isinstance(self.program, torch.export.ExportedProgram)

    @property
    def graph_module(self) -> Any:
        return self.program.graph_module if self.is_exported else self.program


class _Refused(Exception):
    pass


@contextlib.contextmanager
def _no_pickle() -> Iterator[None]:
    """Close every path by which ``torch.export.load`` could unpickle arbitrary objects."""
    import torch
    from torch.export.pt2_archive import _package

    real_load = torch.load

    def weights_only_load(f: Any, *args: Any, **kwargs: Any) -> Any:
        kwargs["weights_only"] = True
        return real_load(f, *args, **kwargs)

    def refuse(*_a: Any, **_k: Any) -> Any:
        raise _Refused("the file holds pickled Python objects")

    saved = (torch.load, _package.pickle, torch._C._pickle_load_obj)
    torch.load = weights_only_load
    _package.pickle = types.SimpleNamespace(loads=refuse, load=refuse)
    torch._C._pickle_load_obj = refuse
    try:
        yield
    finally:
        torch.load, _package.pickle, torch._C._pickle_load_obj = saved


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """torch logs tracebacks while it tries fallbacks; the command reports one line instead."""
    previous = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(previous)


def _load_pt2(path: Path) -> Target:
    import pickle

    import torch

    if not zipfile.is_zipfile(path):
        raise CliError(f"cannot load {path}: not a .pt2 archive (not a zip file)", LOAD)
    try:
        with _quiet(), _no_pickle():
            ep = torch.export.load(path)
    except _Refused as e:
        raise CliError(
            f"refusing to load {path}: {e}, which could run code; fxpass loads only "
            "plain tensors from .pt2 files",
            LOAD,
        ) from e
    except pickle.UnpicklingError as e:
        found = [ln.strip() for ln in str(e).splitlines() if "GLOBAL" in ln]
        what = f" ({found[0].rstrip('.')})" if found else ""
        raise CliError(
            f"refusing to load {path}: it holds pickled Python objects{what}, which could "
            "run code; fxpass loads only plain tensors from .pt2 files",
            LOAD,
        ) from e
    except Exception as e:
        first = (str(e).strip().splitlines() or [""])[0][:200]
        raise CliError(
            f"cannot load {path}: damaged or not written by torch.export.save "
            f"({type(e).__name__}: {first})",
            LOAD,
        ) from e
    example = getattr(ep, "example_inputs", None)
    args, kwargs = (list(example[0]), dict(example[1])) if example else (None, {})
    return Target(str(path), "pt2", ep, args, kwargs)


def _load_fxgraph(path: Path) -> Target:
    from ..core.serialize import GraphFileError, load_graph

    try:
        gm, inputs = load_graph(path)
    except GraphFileError as e:
        raise CliError(str(e), LOAD) from e
    except Exception as e:
        raise CliError(f"cannot load {path}: {type(e).__name__}: {e}", LOAD) from e
    return Target(str(path), "fxgraph", gm, inputs)


def _load_python(ref: str, decompose: bool) -> Target:
    import torch
    from torch import fx

    module_name, _, attr = ref.partition(":")
    if not module_name or not attr:
        raise CliError(f"TARGET {ref!r} is not module:function. {TARGET_HELP}", USAGE)
    cwd = str(Path.cwd())
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except Exception as e:
        raise CliError(f"cannot import TARGET {ref}: {type(e).__name__}: {e}", LOAD) from e
    try:
        made = obj() if callable(obj) and not isinstance(obj, torch.nn.Module) else obj
    except Exception as e:
        raise CliError(f"TARGET function {ref} raised {type(e).__name__}: {e}", LOAD) from e
    if isinstance(made, torch.export.ExportedProgram):
        example = getattr(made, "example_inputs", None)
        args = list(example[0]) if example else None
        return Target(ref, "python", made, args, dict(example[1]) if example else {})
    if isinstance(made, fx.GraphModule):
        return Target(ref, "python", made, None)
    if isinstance(made, tuple) and len(made) == 2 and isinstance(made[0], torch.nn.Module):
        model, inputs = made
        inputs = tuple(inputs) if isinstance(inputs, (list, tuple)) else (inputs,)
        if isinstance(model, fx.GraphModule):
            return Target(ref, "python", model, list(inputs))
        try:
            with _quiet():
                ep = torch.export.export(model, inputs)
                if decompose:
                    ep = ep.run_decompositions()
        except Exception as e:
            first = (str(e).strip().splitlines() or [""])[0][:200]
            raise CliError(
                f"cannot export the model from {ref}: {type(e).__name__}: {first}", LOAD
            ) from e
        return Target(ref, "python", ep, list(inputs))
    raise CliError(
        f"TARGET function {ref} returned {type(made).__name__}; it must return "
        "(model, example_inputs), an ExportedProgram or a GraphModule",
        LOAD,
    )


def load_target(text: str, *, decompose: bool = True) -> Target:
    """Load a TARGET (see the module docstring); every failure is a one-line CliError."""
    path = Path(text)
    looks_like_file = path.suffix in (".pt2", ".fxgraph") or os.sep in text or path.exists()
    if looks_like_file and not (":" in text and not path.exists() and path.suffix == ""):
        if not path.exists():
            raise CliError(f"no such file: {text}. {TARGET_HELP}", LOAD)
        if path.is_dir():
            raise CliError(f"{text} is a folder; {TARGET_HELP}", LOAD)
        if path.suffix == ".fxgraph":
            return _load_fxgraph(path)
        return _load_pt2(path)
    if ":" in text:
        return _load_python(text, decompose)
    raise CliError(f"no such file: {text}. {TARGET_HELP}", LOAD)
