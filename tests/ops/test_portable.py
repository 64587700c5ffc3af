"""Each fused op's decomposition into torch's own ops computes what the op computes, for
every call its contract draws (dtypes and layouts); every op that can be lowered has one."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_op_contract import OPS, TOLERANCE, _contract, _resolve, _run
from torch.utils import _pytree as pytree

from fxpass.ops.portable import decomposition

#: Ops that only schedule work (streams, events): nothing in torch's own ops stands for them.
NOT_LOWERED = {name for name in OPS if "stream" in name or "event" in name}
LOWERED = sorted(name for name in OPS if name not in NOT_LOWERED)


def _clone(call_args: Any) -> Any:
    return pytree.tree_map_only(torch.Tensor, lambda t: t.clone(), call_args)


def test_every_fused_op_has_a_decomposition():
    assert LOWERED, OPS
    missing = [name for name in LOWERED if decomposition(_resolve(name)) is None]
    assert not missing, f"fused ops without a decomposition (ops/portable.py): {missing}"


@pytest.mark.parametrize("name", LOWERED)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_decomposition_computes_what_the_op_computes(name, data):
    contract = _contract(name)
    call = data.draw(contract.calls, label="call")
    op = _resolve(name)
    with contract.context():
        args, kwargs = _clone((call.args, call.kwargs))
        got, error = _run(lambda: decomposition(op)(*args, **kwargs))
        real, real_error = _run(lambda: op(*call.args, **call.kwargs))
    if real_error is not None:
        return  # a call the op refuses: the decomposition need not say so
    assert error is None, f"{name}{call}: the decomposition raised {error!r}"
    if op._schema.is_mutable:  # in place: compare what the arguments became
        got, real = args[:2], call.args[:2]
    for g, e in zip(pytree.tree_leaves(got), pytree.tree_leaves(real), strict=True):
        assert g.dtype == e.dtype and g.shape == e.shape, f"{name}{call}"
        if g.is_floating_point():
            tol = TOLERANCE[g.dtype]
            torch.testing.assert_close(g, e, rtol=tol, atol=tol)
        else:  # int8 codes: rounded once vs twice may land one code apart
            assert (g.int() - e.int()).abs().max().item() <= 1
