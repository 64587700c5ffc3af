"""Shared, cached captures for the verify tests (fresh copies handed out)."""

from __future__ import annotations

import copy
import functools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fxpass.verify.inputs import program_inputs


@functools.cache
def _program() -> torch.export.ExportedProgram:
    import _models

    return _models.exported()


def program() -> torch.export.ExportedProgram:
    """The exported 2-layer tiny decoder (core ATen), a fresh copy."""
    return copy.deepcopy(_program())


def graph_and_inputs() -> tuple[torch.fx.GraphModule, list]:
    ep = program()
    return ep.graph_module, program_inputs(ep, *ep.example_inputs)
