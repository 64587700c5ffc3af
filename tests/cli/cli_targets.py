"""module:function TARGETs for the CLI tests (imported by `fxpass` because the user asked)."""

from __future__ import annotations

from fxpass.models.llama import build_decoder


def tiny():
    """A 2-layer tiny decoder and its example inputs."""
    model = build_decoder(layers=2)
    return model, model.example_inputs()


def broken():
    raise ValueError("this target is broken on purpose")


def not_a_model():
    return 42
