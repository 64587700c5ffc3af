"""What the examples share: the tiny decoder, exported, and a way to print a graph."""

from __future__ import annotations

import torch

from fxpass.models.llama import build_decoder


def exported_decoder(layers: int = 1):
    """``(exported_program, example_inputs)`` of the embedded tiny Llama-style decoder."""
    model = build_decoder(layers=layers)
    inputs = model.example_inputs()
    return torch.export.export(model, inputs).run_decompositions(), inputs


def show(title: str, gm: torch.fx.GraphModule, *, contains: str | None = None) -> None:
    """Print the graph's code; with ``contains``, only the lines that mention it."""
    lines = gm.code.strip().splitlines()
    if contains:
        lines = [line for line in lines if contains in line]
    print(f"----- {title} ({len(gm.graph.nodes)} nodes) -----")
    print("\n".join(lines))
