"""One model, every graph a user may hand a pass: torch.export (as exported, and core ATen),
AOTAutograd's forward graph and Dynamo's torch-level graph, each captured once per process.

>>> cap = captured("decoder", "aot")      # a fresh copy: .gm, .run(), .expected
>>> cap.gm.graph ...; cap.run()

Models are named (:data:`MODELS`) so that captures cache by name; each is built from a
config with seeded random weights (tests/_models.py, tests/_hf.py).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch.utils import _pytree as pytree

from fxpass.fxutil.fx_internals import copy_sharing_specs
from fxpass.fxutil.graph_forms import spelled

from _models import lifted_inputs

#: The graph forms (fxutil/graph_forms.py): export as users save it, export with core-ATen
#: decompositions, AOT, Dynamo.
IRS = tuple(spelled({"export": "export", "export_aten": "aten", "aot": "aot", "dynamo": "dynamo"}))


def _decoder(dtype: torch.dtype) -> tuple[torch.nn.Module, tuple]:
    from _models import decoder

    model = decoder(dtype=dtype)
    return model, model.example_inputs()


def _hf_model(family: str) -> tuple[torch.nn.Module, tuple]:
    import _hf

    return _hf.model(family), _hf.example_inputs()


#: name -> () -> (model, example inputs)
MODELS: dict[str, Callable[[], tuple[torch.nn.Module, tuple]]] = {
    "decoder": lambda: _decoder(torch.bfloat16),
    "decoder_fp32": lambda: _decoder(torch.float32),
    "hf_llama": lambda: _hf_model("llama"),
    "hf_qwen3": lambda: _hf_model("qwen3"),
}


def _exported_decoder(dtype: torch.dtype, decompose: bool) -> torch.export.ExportedProgram:
    from _models import exported

    return exported(decompose=decompose, dtype=dtype)


def _exported_hf(family: str, decompose: bool) -> torch.export.ExportedProgram:
    import _hf

    ep = _hf.exported(family)
    return ep.run_decompositions() if decompose else ep


#: name -> (decompose) -> the ExportedProgram (shared with the other tests' caches)
EXPORTED: dict[str, Callable[[bool], torch.export.ExportedProgram]] = {
    "decoder": lambda d: _exported_decoder(torch.bfloat16, d),
    "decoder_fp32": lambda d: _exported_decoder(torch.float32, d),
    "hf_llama": lambda d: _exported_hf("llama", d),
    "hf_qwen3": lambda d: _exported_hf("qwen3", d),
}


def _leaves(out: Any) -> list[torch.Tensor]:
    if hasattr(out, "to_tuple"):  # a Hugging Face ModelOutput
        out = out.to_tuple()
    return [x for x in pytree.tree_leaves(out) if isinstance(x, torch.Tensor)]


@functools.cache
def _capture(name: str, ir: str) -> tuple[Any, list, list[torch.Tensor]]:
    model, args = MODELS[name]()
    with torch.no_grad():
        expected = _leaves(model(*args))
    if ir in ("export", "export_aten"):
        return EXPORTED[name](ir == "export_aten"), list(args), expected
    if ir not in IRS:
        raise ValueError(f"unknown ir {ir!r}; choose from {IRS}")
    gm, real = dynamo_capture(model, args, ir)
    return gm, real, expected


class Captured:
    """A fresh copy of a capture: ``gm`` to run passes on, ``run()`` its outputs (a list of
    tensors), ``expected`` the eager model's."""

    def __init__(self, name: str, ir: str) -> None:
        program, args, expected = _capture(name, ir)
        self.ir = ir
        self.program = copy_sharing_specs(program)
        self.gm = self.program if isinstance(self.program, torch.fx.GraphModule) else None
        if self.gm is None:
            self.gm = self.program.graph_module
        self.args = args
        self.expected = expected

    def run(self) -> list[torch.Tensor]:
        """The graph's outputs (an exported graph run directly, its parameters passed in:
        ``ep.module()`` would take a second to build for a Hugging Face model)."""
        self.gm.recompile()
        with torch.no_grad():
            if isinstance(self.program, torch.export.ExportedProgram):
                ep = self.program
                flat = self.gm(*lifted_inputs(ep), *self.args)
                return _leaves(list(flat)[-len(ep.graph_signature.user_outputs) :])
            return _leaves(self.gm(*self.args))


def captured(name: str, ir: str) -> Captured:
    return Captured(name, ir)


def dynamo_capture(model: Any, args: Any, ir: str) -> tuple[torch.fx.GraphModule, list]:
    """The last graph ``torch.compile`` hands its backend — Dynamo's (``ir="dynamo"``) or
    AOTAutograd's forward (``"aot"``) — and the real example inputs Dynamo passed."""
    graphs: list[torch.fx.GraphModule] = []
    real: list[list] = []

    def keep(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def backend(gm, example_inputs):  # Dynamo hands its backend real example inputs
        real.append(list(example_inputs))
        if ir == "dynamo":
            return keep(gm, example_inputs)
        from torch._dynamo.backends.common import aot_autograd

        return aot_autograd(fw_compiler=keep)(gm, example_inputs)

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, backend=backend, fullgraph=True, dynamic=False)(*args)
    torch._dynamo.reset()
    return graphs[-1], real[0]
