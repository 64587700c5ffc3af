"""The contract every custom op under ``torch.ops.fxpass`` keeps, and one entry per op.

An entry says how to call the op: a hypothesis strategy of calls (shapes, dtypes, layouts —
whatever the op takes) and a few fixed calls for ``torch.library.opcheck``. The tests in
``tests/ops/test_op_contract.py`` then check, for every op the dispatcher knows in the
``fxpass`` namespace, that its fake kernel agrees with its real kernel on every output's
shape, dtype and (significant) strides, on the metadata of the arguments it mutates and on
whether it raises, and that it values match its reference where the entry gives one.

Adding an op is one entry in one of this package's modules (or one new module here: every
module's ``CONTRACTS`` dict is collected)::

    CONTRACTS = {"fxpass::my_op": Contract(calls=my_calls, examples=my_examples)}

``tensors`` (below) draws tensors in every layout the contract covers: contiguous,
transposed (any permutation), sliced (a window of a larger tensor) and expanded (size-one
dimensions broadcast).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from hypothesis import strategies as st

__all__ = [
    "DTYPES",
    "LAYOUTS",
    "Call",
    "Contract",
    "all_contracts",
    "in_layout",
    "tensors",
]

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
LAYOUTS = ("contiguous", "transposed", "sliced", "expanded")


@dataclass(frozen=True)
class Call:
    """One call of an op: ``op(*args, **kwargs)``."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:
        def show(a: Any) -> str:
            if isinstance(a, torch.Tensor):
                return f"T{tuple(a.shape)}{tuple(a.stride())}:{str(a.dtype)[6:]}"
            return repr(a)

        shown = [show(a) for a in self.args] + [f"{k}={show(v)}" for k, v in self.kwargs.items()]
        return f"Call({', '.join(shown)})"


@dataclass(frozen=True)
class Contract:
    """How the contract tests call one op.

    Args:
        calls: a hypothesis strategy of :class:`Call` (the property test draws from it).
        examples: fixed calls for ``torch.library.opcheck`` (a few layouts; inputs that should
            get gradients require them).
        reference: ``reference(call) -> outputs`` to compare the real outputs with (values,
            within the dtype's tolerance, and layouts), or None.
        observed: what is compared with the reference: ``observed(call, outputs)``; an
            in-place op returns its mutated arguments here.
        opcheck_utils: which opcheck tests to run (default: all of them).
        context: a context manager factory the calls run in (a process group, a stream).
    """

    calls: st.SearchStrategy[Call]
    examples: Callable[[], Sequence[Call]]
    reference: Callable[[Call], Any] | None = None
    observed: Callable[[Call, Any], Any] = lambda call, out: out
    opcheck_utils: tuple[str, ...] | None = None
    context: Callable[[], AbstractContextManager[Any]] = nullcontext


def in_layout(
    shape: Sequence[int], dtype: torch.dtype, layout: str, seed: int = 0, perm: Sequence[int] = ()
) -> torch.Tensor:
    """A tensor of ``shape`` with random values in ``layout`` (see :data:`LAYOUTS`).

    ``transposed`` stores the dimensions in the order ``perm`` (default: reversed);
    ``sliced`` takes a window of a tensor twice as large in each dimension;
    ``expanded`` broadcasts every other dimension from size one.
    """
    gen = torch.Generator().manual_seed(seed)

    def rand(*s: int) -> torch.Tensor:
        return torch.randn(s, generator=gen).to(dtype)

    shape = tuple(shape)
    if layout == "contiguous" or not shape:
        return rand(*shape)
    if layout == "transposed":
        order = list(perm) or list(range(len(shape)))[::-1]
        stored = rand(*(shape[d] for d in order))
        return stored.permute([order.index(d) for d in range(len(shape))])
    if layout == "sliced":
        big = rand(*(2 * n + 1 for n in shape))
        return big[tuple(slice(1, 1 + n) for n in shape)]
    if layout == "expanded":
        small = tuple(1 if i % 2 == 0 else n for i, n in enumerate(shape))
        return rand(*small).expand(shape)
    raise ValueError(f"unknown layout {layout!r}; use one of {LAYOUTS}")


@st.composite
def tensors(
    draw: Any,
    shape: Sequence[int],
    dtypes: Sequence[torch.dtype] = DTYPES,
    layouts: Sequence[str] = LAYOUTS,
) -> torch.Tensor:
    """A strategy of tensors of ``shape`` in any of ``dtypes`` and ``layouts``."""
    layout = draw(st.sampled_from(layouts))
    perm = draw(st.permutations(range(len(shape)))) if layout == "transposed" else ()
    dtype = draw(st.sampled_from(dtypes))
    return in_layout(shape, dtype, layout, draw(st.integers(0, 2**16)), perm)


def all_contracts() -> dict[str, Contract]:
    """Every module's ``CONTRACTS`` in this package, merged (a name twice is an error)."""
    merged: dict[str, Contract] = {}
    for info in pkgutil.iter_modules(__path__, f"{__name__}."):
        module = importlib.import_module(info.name)
        for name, contract in getattr(module, "CONTRACTS", {}).items():
            if name in merged:
                raise ValueError(f"{name} has two contract entries (the second in {info.name})")
            merged[name] = contract
    return merged
