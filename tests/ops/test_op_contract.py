"""The op contract: every custom op under ``torch.ops.fxpass`` has a fake kernel that agrees
with its real kernel on shape, dtype and strides for every input layout, and passes
``torch.library.opcheck``. The ops are the ones the dispatcher knows after importing every
fxpass module — not a hand-kept list — so a new op without an entry fails here.
Entries live in ``tests/ops/_op_contracts/`` (see docs/ops.md, "Adding an op")."""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

import pytest
import torch
from _op_contracts import Call, Contract, all_contracts
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils import _pytree as pytree

import fxpass
from fxpass.fxutil.layout import format_layout, same_layout

NAMESPACE = "fxpass"
TOLERANCE = {torch.float32: 2e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3, torch.float64: 1e-9}


def _import_every_module() -> None:
    """Import all of fxpass, so every op it can register is registered."""
    for info in pkgutil.walk_packages(fxpass.__path__, "fxpass."):
        if info.name.endswith("__main__"):
            continue
        try:
            importlib.import_module(info.name)
        except ModuleNotFoundError as e:  # an optional dependency (triton) is not installed
            if e.name is None or e.name.split(".")[0] == "fxpass":
                raise


def registered_ops(namespace: str = NAMESPACE) -> list[str]:
    """``namespace::name`` (``.overload`` where not default) of every op in ``namespace``."""
    _import_every_module()
    prefix = f"{namespace}::"
    return sorted(n for n in torch._C._dispatch_get_all_op_names() if n.startswith(prefix))


def _resolve(name: str) -> torch._ops.OpOverload:
    namespace, rest = name.split("::")
    op, _, overload = rest.partition(".")
    return getattr(getattr(getattr(torch.ops, namespace), op), overload or "default")


OPS = registered_ops()
CONTRACTS = all_contracts()


def _contract(name: str) -> Contract:
    if name not in CONTRACTS:
        pytest.skip(f"{name} has no contract entry (test_every_op_has_a_contract says so)")
    return CONTRACTS[name]


def test_every_op_has_a_contract():
    assert "fxpass::rms_norm" in OPS  # the enumeration works
    missing = [n for n in OPS if n not in CONTRACTS]
    assert not missing, (
        f"custom ops without a contract entry: {missing}; add one to a module in "
        "tests/ops/_op_contracts/ (docs/ops.md, 'Adding an op')"
    )
    stale = sorted(set(CONTRACTS) - set(OPS))
    assert not stale, f"contract entries for ops that are not registered: {stale}"


def test_an_op_registered_later_is_enumerated():
    """Ops are found in the dispatcher, however they were defined (probe: its own namespace)."""
    lib = torch.library.Library("fxpass_contract_probe", "FRAGMENT")
    lib.define("stream_op(int stream) -> ()")
    lib.define("pair(Tensor x) -> (Tensor, Tensor)")
    assert registered_ops("fxpass_contract_probe") == [
        "fxpass_contract_probe::pair",
        "fxpass_contract_probe::stream_op",
    ]


# ----- real and fake agree -----------------------------------------------------------------
def _run(fn: Any) -> tuple[Any, BaseException | None]:
    try:
        return fn(), None
    except Exception as e:
        return None, e


def _first_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def check_call(name: str, contract: Contract, call: Call) -> None:
    """Fake and real kernels agree on ``call``; the real one matches the reference."""
    op = _resolve(name)
    mode = FakeTensorMode()
    fake_args, fake_kwargs = pytree.tree_map_only(
        torch.Tensor, mode.from_tensor, (call.args, call.kwargs)
    )
    with mode:
        fake, fake_error = _run(lambda: op(*fake_args, **fake_kwargs))
    expected = None
    if fake_error is None and contract.reference is not None:
        expected = contract.reference(call)  # before the real call: it may mutate the args
    real, real_error = _run(lambda: op(*call.args, **call.kwargs))
    if (fake_error is None) != (real_error is None):
        raised, quiet = ("fake", "real") if fake_error else ("real", "fake")
        error = fake_error or real_error
        pytest.fail(
            f"{name}{call}: the {raised} kernel raises ({_first_line(error)}), the {quiet} not"
        )
    if real_error is not None:
        return
    _assert_same_meta(name, call, "output", real, fake)
    _assert_same_meta(name, call, "argument after the call", call.args, fake_args)
    if expected is not None:
        _assert_matches_reference(name, call, contract.observed(call, real), expected)


def _assert_same_meta(name: str, call: Call, what: str, real: Any, fake: Any) -> None:
    real_leaves, real_spec = pytree.tree_flatten(real)
    fake_leaves, fake_spec = pytree.tree_flatten(fake)
    assert real_spec == fake_spec, f"{name}{call}: real returns {real_spec}, fake {fake_spec}"
    for i, (r, f) in enumerate(zip(real_leaves, fake_leaves)):
        if not isinstance(r, torch.Tensor):
            assert r == f, f"{name}{call}: {what} {i} is {r!r} real, {f!r} fake"
            continue
        same = tuple(r.shape) == tuple(f.shape) and r.dtype == f.dtype and same_layout(r, f)
        assert same, (
            f"{name}{call}: {what} {i}: real {format_layout(r)} {r.dtype}, "
            f"fake {format_layout(f)} {f.dtype}"
        )


def _assert_matches_reference(name: str, call: Call, got: Any, expected: Any) -> None:
    for i, (g, e) in enumerate(zip(pytree.tree_leaves(got), pytree.tree_leaves(expected))):
        where = f"{name}{call}: output {i}"
        assert g.dtype == e.dtype and g.shape == e.shape, f"{where}: {g.dtype} vs {e.dtype}"
        assert same_layout(g, e), f"{where}: {format_layout(g)}, reference {format_layout(e)}"
        if g.is_floating_point():
            tol = TOLERANCE[g.dtype]
            torch.testing.assert_close(
                g, e, rtol=tol, atol=tol, msg=lambda m, where=where: f"{where}: {m}"
            )
        else:  # quantized codes: a value rounded once vs twice may land one code apart
            assert (g.int() - e.int()).abs().max().item() <= 1, where


@pytest.mark.parametrize("name", OPS)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fake_kernel_agrees_with_real_kernel(name, data):
    contract = _contract(name)
    call = data.draw(contract.calls, label="call")
    with contract.context():
        check_call(name, contract, call)


@pytest.mark.parametrize("name", OPS)
def test_opcheck(name):
    contract = _contract(name)
    op = _resolve(name)
    for call in contract.examples():
        with contract.context():
            kwargs = {"test_utils": contract.opcheck_utils} if contract.opcheck_utils else {}
            torch.library.opcheck(op, call.args, call.kwargs, **kwargs)
