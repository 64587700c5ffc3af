"""ExecuTorch Edge programs of the embedded models, for the tests that need the Edge dialect.

``to_edge`` takes seconds, so each program is built once per process; tests get fresh
copies they may mutate. The module skips its importer's tests where ``executorch`` is not
installed (it is in the ``test`` extra, so CI runs them).

>>> edge = edge_manager("llama")           # an EdgeProgramManager
>>> ep = edge_program("convnet")           # its ExportedProgram (Edge dialect)
"""

from __future__ import annotations

import copy
import functools
from typing import Any

import pytest
import torch

pytest.importorskip("executorch.exir")

from executorch.exir import EdgeCompileConfig, EdgeProgramManager, to_edge

from fxpass.models.convnet import build_convnet
from fxpass.models.llama import build_decoder

#: The embedded models by name, as ExecuTorch users would export them (float32, eval).
MODELS = ("llama", "convnet")


@functools.cache
def module(name: str, **overrides: Any) -> torch.nn.Module:
    """The embedded model ``name`` in float32 (ExecuTorch's portable kernels' dtype)."""
    if name == "llama":
        return build_decoder(dtype=torch.float32, **overrides)
    if name == "convnet":
        return build_convnet(**overrides)
    raise ValueError(f"unknown model {name!r}; choose from {MODELS}")


def example_inputs(name: str, **overrides: Any) -> tuple[torch.Tensor, ...]:
    return module(name, **overrides).example_inputs()


@functools.cache
def _manager(name: str, items: tuple) -> EdgeProgramManager:
    overrides = dict(items)
    m = module(name, **overrides)
    ep = torch.export.export(m, m.example_inputs())
    return to_edge(ep, compile_config=EdgeCompileConfig(_check_ir_validity=True))


def edge_manager(name: str = "llama", **overrides: Any) -> EdgeProgramManager:
    """A fresh copy of ``to_edge(torch.export.export(model, inputs))``."""
    return copy.deepcopy(_manager(name, tuple(sorted(overrides.items()))))


def edge_program(name: str = "llama", **overrides: Any) -> torch.export.ExportedProgram:
    """A fresh copy of the Edge-dialect ExportedProgram of model ``name``."""
    return edge_manager(name, **overrides).exported_program()
