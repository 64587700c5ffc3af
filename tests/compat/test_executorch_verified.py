"""The Edge verifier's dtype check runs once per graph shape that passed, and its validator
takes fake results from fxpass's cache."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("executorch.exir")

from _executorch_helpers import edge_program
from executorch.exir.verification import verifier as et_verifier
from torch._export.verifier import SpecViolationError

from fxpass.compat.executorch._verified import arg_validator, dtype_check, graph_shape

_ORIGINAL = et_verifier._check_tensor_args_matching_op_allowed_dtype  # this process: no install


def _counting_check():
    runs = []

    def check(gm):
        runs.append(gm)
        _ORIGINAL(gm)

    return dtype_check(check), runs


def test_graphs_of_one_shape_are_checked_once():
    a, b = edge_program("add_relu"), edge_program("add_relu")  # copies: other tensors
    for node in b.graph.nodes:  # and other names
        if node.op != "output":
            node.name = f"{node.name}_other"
    assert graph_shape(a.graph_module) == graph_shape(b.graph_module) is not None
    check, runs = _counting_check()
    check(a.graph_module)
    check(b.graph_module)
    assert runs == [a.graph_module]


def test_another_dtype_is_another_shape_and_is_checked():
    ep = edge_program("add_relu")
    check, runs = _counting_check()
    check(ep.graph_module)
    add = next(n for n in ep.graph.nodes if n.op == "call_function")
    add.meta["val"] = add.meta["val"].to(torch.float64)  # the add now claims float64
    assert graph_shape(ep.graph_module) not in check.passed
    with pytest.raises(SpecViolationError, match="mismatched dtypes"):
        check(ep.graph_module)
    with pytest.raises(SpecViolationError):  # a failure is never remembered
        check(ep.graph_module)
    assert len(runs) == 3


def test_symbolic_sizes_are_checked_every_time():
    ep = edge_program("dynamic")
    assert graph_shape(ep.graph_module) is None
    check, runs = _counting_check()
    check(ep.graph_module)
    check(ep.graph_module)
    assert len(runs) == 2


def test_the_validator_finds_what_executorchs_finds():
    from fxpass.fxutil.values import FAKE_RESULTS

    cached = arg_validator(et_verifier.EdgeOpArgValidator)
    for name in ("add_relu", "constant"):
        ep = edge_program(name)
        gm = ep.graph_module
        add = next(n for n in gm.graph.nodes if n.op == "call_function")
        add.meta["val"] = add.meta["val"].to(torch.float64)
        found = []
        for validator in (et_verifier.EdgeOpArgValidator, cached, cached):  # cold, then warm
            hits = FAKE_RESULTS.hits
            v = validator(gm)
            mode = et_verifier._detect_fake_mode_from_gm(gm)
            with mode:
                v.run(*et_verifier._get_inputs(gm))
            found.append({op: args for op, (args, _) in v.violating_ops.items()})
        assert found[0] == found[1] == found[2] and found[0]
        assert FAKE_RESULTS.hits > hits  # the warm run took results from the cache
