"""torch.fx.passes.infra style: PassManager with constraints, steps and checks.

Code written against ``torch.fx.passes.infra`` runs unchanged on ``fxpass.compat.fx`` —
only the import changes — and gains rollback on failure, one recompile per call and a
``pass_result_wrapper`` that reports "modified" honestly, so ``steps`` stops as soon as a
round changes nothing:

    python examples/torch_fx_infra_style.py
"""

from __future__ import annotations

import torch
from _common import exported_decoder, show

from fxpass.compat.fx import (
    PassManager,
    pass_result_wrapper,
    this_before_that_pass_constraint,
)

aten = torch.ops.aten


def remove_one_assert(gm):
    """Removes one assert per call, so the manager needs several rounds (steps)."""
    for node in gm.graph.nodes:
        if node.target is aten._assert_tensor_metadata.default:
            gm.graph.erase_node(node)
            return


def rsqrt_to_reciprocal_sqrt(gm):
    """rsqrt(x) -> reciprocal(sqrt(x)); must run after the asserts are gone."""
    for node in list(gm.graph.nodes):
        if node.target is aten.rsqrt.default:
            with gm.graph.inserting_before(node):
                sqrt = gm.graph.call_function(aten.sqrt.default, node.args)
                recip = gm.graph.call_function(aten.reciprocal.default, (sqrt,))
            node.replace_all_uses_with(recip)
            gm.graph.erase_node(node)


def no_asserts_left_at_the_end(gm):
    """A check: the graph must stay well-formed (lint) after every pass."""
    gm.graph.lint()


def main() -> None:
    ep, _ = exported_decoder()
    gm = ep.graph_module
    removers = pass_result_wrapper(remove_one_assert)
    rewrite = pass_result_wrapper(rsqrt_to_reciprocal_sqrt)
    pm = PassManager(
        passes=[rewrite, removers],
        constraints=[this_before_that_pass_constraint(removers, rewrite)],
        steps=20,
        run_checks_after_each_pass=True,
    )
    pm.add_checks(no_asserts_left_at_the_end)
    show("before", gm, contains="rsqrt")
    result = pm(gm)
    show("after", result.graph_module, contains="sqrt")
    print(f"modified={result.modified}; rounds run: {pm.report.root.stats['iterations']} of 20")
    print(pm.report)


if __name__ == "__main__":
    main()
