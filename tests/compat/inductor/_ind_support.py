"""Shared pieces of the tests of fxpass.compat.inductor: client pass files loaded against
Inductor's pattern matcher and against fxpass's, and small graphs in Inductor's dialect."""

from __future__ import annotations

import contextlib
import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import fxpass.compat.inductor as fxi

HERE = Path(__file__).resolve().parent
MATCHERS = ("inductor", "fxpass")


def load_client(filename: str, matcher: str) -> ModuleType:
    """Execute the client file ``filename`` as a fresh module whose imports of
    ``torch._inductor.pattern_matcher`` get Inductor's (``"inductor"``) or, under
    ``install()``, fxpass's (``"fxpass"``) objects."""
    ctx = fxi.installed() if matcher == "fxpass" else contextlib.nullcontext()
    name = f"{Path(filename).stem}_{matcher}"
    with ctx:
        spec = importlib.util.spec_from_file_location(name, HERE / filename)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return module


def pattern_matcher(matcher: str) -> Any:
    """The module a client gets: Inductor's, or fxpass's drop-in."""
    if matcher == "fxpass":
        return fxi
    import torch._inductor.pattern_matcher as inductor

    return inductor


def make_graph(fn: Any, *args: torch.Tensor) -> torch.fx.GraphModule:
    """``fn`` traced into Inductor's dialect (``fwd_only``), fake values on every node."""
    from torch._inductor.pattern_matcher import fwd_only

    mode = FakeTensorMode()
    fakes = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
    with mode:
        return fwd_only(fn, fakes)


def same(a: Any, b: Any) -> bool:
    """Outputs equal bit for bit (tensors, or lists of them)."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def close(a: list[torch.Tensor], b: list[torch.Tensor], tol: float = 1e-5) -> bool:
    return len(a) == len(b) and all(torch.allclose(x, y, atol=tol, rtol=tol) for x, y in zip(a, b))
