"""Multi-stream schedules the tests share: the embedded decoders scheduled once per session,
handed out as fresh copies, with the inputs their graphs take."""

from __future__ import annotations

import copy
import functools

import torch

import fxpass as fp
from fxpass.verify.inputs import program_inputs

import _models

#: The three models of the streams work: plain, MoE (shared + routed experts), parallel block.
MODELS = {
    "decoder": {},
    "moe": {"moe_experts": 4},
    "parallel": {"parallel_block": True},
}


@functools.cache
def _original(name: str) -> tuple[torch.fx.GraphModule, tuple]:
    ep = _models.exported(**MODELS[name])
    gm = _models.exported_gm(remove_asserts=True, **MODELS[name])
    return gm, tuple(program_inputs(ep, *ep.example_inputs))


@functools.cache
def _scheduled(name: str, spec: str) -> tuple[torch.fx.GraphModule, fp.PassResult]:
    gm = copy.deepcopy(_original(name)[0])
    result = fp.Pipeline.parse(spec).run(gm)
    return gm, result


def original(name: str) -> tuple[torch.fx.GraphModule, list]:
    """A fresh copy of model ``name``'s exported graph (asserts removed) and its inputs."""
    gm, inputs = _original(name)
    return copy.deepcopy(gm), list(inputs)


def scheduled(name: str, spec: str = "multi_stream{streams=2}"):
    """A fresh copy of model ``name`` after ``spec``, and the run's PassResult."""
    gm, result = _scheduled(name, spec)
    return copy.deepcopy(gm), result
