"""TARGETs: what the commands work on, loaded without running code the user did not ask for.

A TARGET is

* a ``.pt2`` file (``torch.export.save``), loaded by :func:`fxpass.targets.pt2.load`: its
  checksums and tensor sizes checked, every pickle path closed, and pytree types this process
  does not know (a Hugging Face ``CausalLMOutputWithPast``) either imported from the packages
  the user allowed with ``--import`` or kept as faithful stand-ins;
* a ``.fxgraph`` file (:func:`fxpass.core.serialize.save_graph`), which holds no code;
* ``module:function`` — imports ``module`` (from the current folder too) and calls
  ``function()``, which returns ``(model, example_inputs)``, an ExportedProgram or a
  GraphModule. This runs that code, by the user's explicit request.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.imports import op_registrars, resolve_import, unknown_op
from ..fxutil.messages import clip, error_summary
from ..targets.pt2 import Pt2Error, load, quiet, stand_in_types
from ._common import AUTO, LOAD, USAGE, CliError, import_allowed, modules_named, stderr

TARGET_HELP = "TARGET is a .pt2 file, a .fxgraph file, or module:function (see docs/cli.md)."


@dataclass
class Target:
    """A loaded TARGET: the program (ExportedProgram or GraphModule) and its user inputs."""

    text: str
    kind: str  # pt2 | fxgraph | python
    program: Any
    args: list[Any] | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)
    #: the modules ``--import auto`` imported to load it
    imported: list[str] = field(default_factory=list)
    #: the user inputs once worked out (see ``_run.user_inputs``)
    inputs: list[Any] | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def is_exported(self) -> bool:
        import torch

        return isinstance(self.program, torch.export.ExportedProgram)

    @property
    def graph_module(self) -> Any:
        return self.program.graph_module if self.is_exported else self.program


def _load_pt2(path: Path, imports: Sequence[str]) -> Target:
    modules, imported = modules_named(imports), []
    while True:
        try:
            ep = load(path, imports=modules)
            break
        except Pt2Error as e:
            module = _needed_module(e, AUTO in imports, imported)
            import_allowed([module])
            modules.append(module)
            imported.append(module)
    unknown = stand_in_types(ep)
    if unknown:
        packages = sorted({name.split(".")[0] for name in unknown})
        stderr().print(
            f"note: {path} uses {', '.join(unknown)}, which this process does not know; it "
            f"runs with a stand-in and is written back unchanged (--import "
            f"{' --import '.join(packages)} gives the real type)",
            style="dim",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
    example = getattr(ep, "example_inputs", None)
    args, kwargs = (list(example[0]), dict(example[1])) if example else (None, {})
    return Target(str(path), "pt2", ep, args, kwargs, imported=imported)


def _needed_module(error: Pt2Error, auto: bool, imported: list[str]) -> str:
    """The module to import for a load that failed on an op no loaded module registers,
    with ``--import auto`` (announced on stderr); else the load's error, one line, exit 3
    (saying ``--import auto`` would import it, when fxpass found the module)."""
    op = unknown_op(error)
    found = op_registrars(op) if op is not None else []
    if not found or found[0] in imported:  # nothing found, or importing it did not help
        raise CliError(str(error), LOAD) from error
    if not auto:
        raise CliError(f"{error}; or --import {AUTO}", LOAD) from error
    stderr().print(
        f"note: importing {found[0]}, which registers {op}, called by the program "
        f"(--import {AUTO})",
        style="dim",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    return found[0]


def _load_fxgraph(path: Path) -> Target:
    from ..core.serialize import GraphFileError, load_graph

    try:
        gm, inputs = load_graph(path)
    except GraphFileError as e:
        raise CliError(str(e), LOAD) from e
    except Exception as e:
        raise CliError(f"cannot load {clip(str(path))}: {error_summary(e)}", LOAD) from e
    return Target(str(path), "fxgraph", gm, inputs)


def _load_python(ref: str, decompose: bool) -> Target:
    import torch
    from torch import fx

    module_name, _, attr = ref.partition(":")
    if not module_name or not attr:
        raise CliError(f"TARGET {clip(ref)!r} is not module:function. {TARGET_HELP}", USAGE)
    try:
        obj: Any = resolve_import(ref)
    except Exception as e:
        raise CliError(
            f"cannot import TARGET {clip(ref)}: {type(e).__name__}: {clip(str(e), 160)}", LOAD
        ) from e
    try:
        made = obj() if callable(obj) and not isinstance(obj, torch.nn.Module) else obj
    except Exception as e:
        raise CliError(f"TARGET function {clip(ref)} raised {error_summary(e)}", LOAD) from e
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
            with quiet():
                ep = torch.export.export(model, inputs)
                if decompose:
                    ep = ep.run_decompositions()
        except Exception as e:
            raise CliError(
                f"cannot export the model from {clip(ref)}: {error_summary(e)}", LOAD
            ) from e
        return Target(ref, "python", ep, list(inputs))
    raise CliError(
        f"TARGET function {clip(ref)} returned {type(made).__name__}; it must return "
        "(model, example_inputs), an ExportedProgram or a GraphModule",
        LOAD,
    )


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except OSError:  # a name the system cannot look up (too long, ...) names no file
        return False


def load_target(text: str, *, decompose: bool = True, imports: Sequence[str] = ()) -> Target:
    """Load a TARGET (see the module docstring); every failure is a one-line CliError.

    ``imports`` are imported first (``--import``); a .pt2 file may also import the modules
    inside those packages that define the types it returns."""
    import_allowed(imports)
    path = Path(text)
    exists = _exists(path)
    looks_like_file = path.suffix in (".pt2", ".fxgraph") or os.sep in text or exists
    if looks_like_file and not (":" in text and not exists and path.suffix == ""):
        if not exists:
            raise CliError(f"no such file: {clip(text)}. {TARGET_HELP}", LOAD)
        if path.is_dir():
            raise CliError(f"{clip(text)} is a folder; {TARGET_HELP}", LOAD)
        if path.suffix == ".fxgraph":
            return _load_fxgraph(path)
        return _load_pt2(path, imports)
    if ":" in text:
        return _load_python(text, decompose)
    raise CliError(f"no such file: {clip(text)}. {TARGET_HELP}", LOAD)
