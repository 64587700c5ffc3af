"""ExecuTorch style: PassBase passes with requires/ensures, and checks after each pass.

The ``ReplaceAddPass`` of ExecuTorch's pass documentation and a check for a backend that has
no ``mul``, run on fxpass. The check fails after the second pass; fxpass names the pass and
the passes that ran before it, and puts the graph back as it was:

    python examples/executorch_style.py
"""

from __future__ import annotations

import torch
from torch import fx

import fxpass as fp
from fxpass.compat.fx import PassBase, PassManager, PassResult


class ReplaceAddPass(PassBase):
    """Replace torch.add with another op (the seed's level-3 example)."""

    def __init__(self, replace_op):
        self.replace_op = replace_op

    def call(self, graph_module):
        for node in graph_module.graph.nodes:
            if node.op == "call_function" and node.target == torch.add:
                node.target = self.replace_op
        return PassResult(graph_module, True)

    def requires(self, graph_module) -> None:
        for node in graph_module.graph.nodes:
            if node.op == "call_function" and node.target == torch.add:
                return
        raise ValueError("No torch.add ops!")

    def ensures(self, graph_module) -> None:
        assert not any(n.target == torch.add for n in graph_module.graph.nodes)


class ReplaceDivWithMul(PassBase):
    def call(self, graph_module):
        for node in graph_module.graph.nodes:
            if node.op == "call_function" and node.target == torch.div:
                node.target = torch.mul
        return PassResult(graph_module, True)


def check_no_mul(graph_module):
    """The backend has no mul."""
    for node in graph_module.graph.nodes:
        if node.op == "call_function" and node.target == torch.mul:
            raise ValueError("this backend cannot run torch.mul")


class Model(torch.nn.Module):
    def forward(self, x, y):
        return torch.add(x, y)


def main() -> None:
    gm = fx.symbolic_trace(Model())
    print("----- before -----\n" + gm.code.strip())

    pm = PassManager(passes=[ReplaceAddPass(torch.div), ReplaceDivWithMul()],
                     run_checks_after_each_pass=True)  # fmt: skip
    pm.add_checks(check_no_mul)
    try:
        pm(gm)
    except Exception as e:
        print(f"PassManager raised: {e}")
        print(f"  because: {type(e.__cause__).__name__}: {e.__cause__}")
    print("----- after the failed run (unchanged) -----\n" + gm.code.strip())

    # The same passes through an fxpass Pipeline: the first pass alone succeeds.
    result = fp.Pipeline([ReplaceAddPass(torch.div)]).add_checks(check_no_mul).run(gm)
    print("----- after ReplaceAddPass -----\n" + result.graph_module.code.strip())
    print(result.report)


if __name__ == "__main__":
    main()
