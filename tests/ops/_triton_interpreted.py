"""The Triton kernels of the fused norm ops, run by Triton's CPU interpreter.

Run as a script with ``TRITON_INTERPRET=1`` (``tests/ops/test_triton_norm.py`` does, in a
subprocess: Triton decides between compiling and interpreting a kernel when ``@triton.jit``
runs, that is when ``fxpass.ops._triton_norm`` is imported, so the variable must be set before
that import and must not reach other tests). Every case launches the kernel on CPU tensors
and compares it with the reference implementations; the script prints one line per case and
exits non-zero if any failed.

Cases: float32, float16 and bfloat16; rows of 16 and 100 (one pass from registers) and
20,000 (the two-pass path); plain, with a residual, quantized, in place; and the layouts the
ops meet — contiguous, transposed, sliced, expanded, and the normalized dimension outermost.

The interpreter converts float32 to bfloat16 by truncation (the GPU rounds to nearest), so
for bfloat16 the residual sums are compared with the truncated sums, exactly, and the
normalized values to within 1.6e-2 (two bfloat16 steps; one is the truncation).
"""

from __future__ import annotations

import os
import sys
import traceback

import torch

from fxpass.fxutil import layout as L
from fxpass.ops import _triton_norm as K
from fxpass.ops import reference as R

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
WIDTHS = (16, 100, 20000)  # 20000 > _MAX_SINGLE: two passes over memory
TOL = {
    torch.float32: dict(rtol=2e-5, atol=2e-5),
    torch.float16: dict(rtol=2e-3, atol=2e-3),
    torch.bfloat16: dict(rtol=1.6e-2, atol=1.6e-2),  # two steps of 8 significant bits
}
LAYOUTS = {
    "transposed": lambda t: t.transpose(1, 2),
    "sliced": lambda t: t.transpose(1, 2)[..., 3:19],
    "expanded": lambda t: t[:1, :1].expand(2, 3, 4, 32),
    "last_dim_outer": lambda t: t.transpose(0, 3)[:16],  # the normalized dim is not innermost
}


def _as_interpreted(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A float32 result as the interpreter stores it in ``dtype``."""
    if dtype is not torch.bfloat16:
        return t.to(dtype)
    bits = t.float().contiguous().view(torch.int32) & ~0xFFFF  # keep the upper 16 bits
    return bits.view(torch.float32).to(torch.bfloat16)


def _sum(x: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """The residual sum the kernel stores (computed in float32, stored in x's dtype)."""
    return _as_interpreted(x.float() + r.float(), x.dtype)


def _inputs(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x, r = torch.randn(shape, generator=g).to(dtype), torch.randn(shape, generator=g).to(dtype)
    w = (1 + 0.1 * torch.randn(shape[-1], generator=g)).to(dtype)
    return x, r, w


def rows(dtype: torch.dtype, n: int) -> None:
    x, r, w = _inputs((3, n), dtype, n)
    tol = TOL[dtype]
    out = torch.empty_like(x)
    K.launch(x, None, w, 1e-6, 1.0, out)
    torch.testing.assert_close(out, R.rms_norm(x, w, 1e-6, 1.0), **tol)

    normed, total = torch.empty_like(x), torch.empty_like(x)
    K.launch(x, r, w, 1e-6, 0.0, normed, total)
    ref_n, _ = R.fused_add_rmsnorm(x, r, w, 1e-6)
    assert torch.equal(total, _sum(x, r)), "the residual sums differ"
    torch.testing.assert_close(normed, ref_n, **tol)

    scale = torch.tensor([0.02])
    q = torch.empty(x.shape, dtype=torch.int8)
    K.launch(x, r, w, 1e-6, 0.0, q, torch.empty_like(x), scale)
    ref_q, _ = R.fused_add_rmsnorm_quant(x, r, w, scale, 1e-6)
    steps = 2 if dtype is torch.bfloat16 else 1  # a bf16 step of the norm can move q by 2
    assert (q.int() - ref_q.int()).abs().max() <= steps, "quantized values differ"

    x2, r2 = x.clone(), r.clone()
    K.launch(x2, r2, w, 1e-6, 0.0, x2, r2)  # in place: inputs are the outputs
    assert torch.equal(r2, _sum(x, r)), "the in-place residual sums differ"
    torch.testing.assert_close(x2, ref_n, **tol)


def layout(dtype: torch.dtype, name: str) -> None:
    base = torch.randn(2, 6, 4, 32, generator=torch.Generator().manual_seed(1))
    make = LAYOUTS[name]
    x, r = make(base).to(dtype), make(base.flip(0)).to(dtype)
    w = (1 + 0.1 * torch.randn(x.shape[-1])).to(dtype)
    tol = TOL[dtype]
    out = L.empty_elementwise(x)  # the ops allocate outputs by this rule
    K.launch(x, None, w, 1e-6, 1.0, out)
    ref = R.rms_norm(x, w, 1e-6, 1.0)
    assert L.same_layout(out, ref), f"layout {out.stride()} against {ref.stride()}"
    torch.testing.assert_close(out, ref, **tol)

    normed, total = L.empty_elementwise(x, r), L.empty_elementwise(x, r)
    K.launch(x, r, w, 1e-6, 0.0, normed, total)
    ref_n, ref_t = R.fused_add_rmsnorm(x, r, w, 1e-6)
    assert L.same_layout(total, ref_t), f"layout {total.stride()} against {ref_t.stride()}"
    assert torch.equal(total, _sum(x, r)), "the residual sums differ"
    torch.testing.assert_close(normed, ref_n, **tol)


def cases():
    for dtype in DTYPES:
        d = str(dtype).removeprefix("torch.")
        for n in WIDTHS:
            yield f"{d} contiguous rows of {n}", rows, (dtype, n)
        for name in LAYOUTS:
            yield f"{d} {name}", layout, (dtype, name)


def main() -> int:
    if os.environ.get("TRITON_INTERPRET") != "1" or type(K._rmsnorm_kernel).__name__ != (
        "InterpretedFunction"
    ):
        print("run with TRITON_INTERPRET=1: the kernels are compiled for a GPU, not interpreted")
        return 2
    failed = 0
    for name, check, args in cases():
        try:
            check(*args)
        except Exception:
            failed += 1
            print(f"FAIL {name}\n{traceback.format_exc()}")
        else:
            print(f"ok   {name}")
    total = sum(1 for _ in cases())
    print(f"{total - failed} of {total} cases passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
