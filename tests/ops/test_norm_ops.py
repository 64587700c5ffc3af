"""fxpass's fused norm ops: numerics against the contract, tracing, autograd, functionalization."""

from __future__ import annotations

import pytest
import torch

import fxpass  # noqa: F401  (registers torch.ops.fxpass)
from fxpass.ops import reference

OPS = torch.ops.fxpass
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}


def _contract_rms(x, w, eps, off=0.0):
    # the formula of the shared contract, spelled out independently of reference.py
    h = x.float()
    return (h * torch.rsqrt((h * h).mean(-1, keepdim=True) + eps) * (w.float() + off)).to(x.dtype)


def _inputs(shape=(2, 3, 32), dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g).to(dtype)
    r = torch.randn(shape, generator=g).to(dtype)
    w = (1 + 0.1 * torch.randn(shape[-1], generator=g)).to(dtype)
    return x, r, w


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("off", [0.0, 1.0])
def test_rms_norm_follows_the_contract(dtype, off):
    x, _, w = _inputs(dtype=dtype)
    out = OPS.rms_norm(x, w, 1e-5, off)
    assert out.dtype == dtype and out.shape == x.shape
    tol = TOL[dtype]
    torch.testing.assert_close(out, _contract_rms(x, w, 1e-5, off), rtol=tol, atol=tol)


def test_eps_is_used_not_assumed():
    x = torch.full((1, 4), 1e-3)
    w = torch.ones(4)
    small, big = OPS.rms_norm(x, w, 1e-12), OPS.rms_norm(x, w, 1.0)
    assert torch.allclose(small, torch.ones(1, 4), atol=1e-4)
    assert torch.allclose(big, x / (1.0 + 1e-6) ** 0.5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_add_rmsnorm_returns_norm_and_sum(dtype):
    x, r, w = _inputs(dtype=dtype)
    normed, total = OPS.fused_add_rmsnorm(x, r, w, 1e-6, 1.0)
    assert torch.equal(total, x + r)
    torch.testing.assert_close(normed, _contract_rms(x + r, w, 1e-6, 1.0))


def test_fused_add_rmsnorm_quant_rounds_half_to_even_and_clamps():
    x, r, w = _inputs(dtype=torch.bfloat16)
    scale = torch.tensor([0.01])
    q, total = OPS.fused_add_rmsnorm_quant(x, r, w, scale, 1e-6)
    normed = _contract_rms(x + r, w, 1e-6)
    expected = torch.clamp(torch.round(normed.float() / scale), -128, 127).to(torch.int8)
    assert q.dtype == torch.int8 and torch.equal(q, expected) and torch.equal(total, x + r)
    assert q.max() == 127 and q.min() == -128  # scale 0.01 saturates
    # ties: 2.5 -> 2, 3.5 -> 4, -2.5 -> -2 (torch.round's rule)
    assert reference.quantize_int8(torch.tensor([2.5, 3.5, -2.5]), torch.tensor(1.0)).tolist() == [
        2,
        4,
        -2,
    ]


def test_in_place_variant_writes_norm_into_x_and_sum_into_residual():
    x, r, w = _inputs(dtype=torch.bfloat16)
    normed, total = OPS.fused_add_rmsnorm(x, r, w, 1e-6)
    x2, r2 = x.clone(), r.clone()
    assert OPS.fused_add_rmsnorm_(x2, r2, w, 1e-6) is None
    assert torch.equal(x2, normed) and torch.equal(r2, total)
    schema = OPS.fused_add_rmsnorm_.default._schema
    assert [a.alias_info is not None and a.alias_info.is_write for a in schema.arguments][:3] == [
        True,
        True,
        False,
    ]


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: OPS.rms_norm(torch.randn(2, 8), torch.ones(7), 1e-6), "weight must be 1-D"),
        (lambda: OPS.rms_norm(torch.ones(2, 8, dtype=torch.int32), torch.ones(8), 1e-6), "float"),
        (
            lambda: OPS.fused_add_rmsnorm(torch.randn(2, 8), torch.randn(8), torch.ones(8), 1e-6),
            "residual must have x's shape",
        ),
        (
            lambda: OPS.fused_add_rmsnorm_quant(
                torch.randn(2, 8), torch.randn(2, 8), torch.ones(8), torch.ones(2), 1e-6
            ),
            "one-element float tensor",
        ),
    ],
)
def test_bad_arguments_say_what_is_wrong(call, message):
    with pytest.raises(RuntimeError, match=message):
        call()


def test_fake_kernels_give_shapes_and_dtypes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(4, 7, 16, dtype=torch.bfloat16)
        w = torch.empty(16)
        assert OPS.rms_norm(x, w, 1e-6).shape == (4, 7, 16)
        q, s = OPS.fused_add_rmsnorm_quant(x, x, w, torch.empty(1), 1e-6)
        assert q.dtype == torch.int8 and s.dtype == torch.bfloat16
        with pytest.raises(RuntimeError, match="weight must be 1-D"):
            OPS.rms_norm(x, torch.empty(15), 1e-6)


@pytest.mark.parametrize("offset", [0.0, 1.0])  # 0.0: ATen's fused kernel runs; 1.0: the reference
def test_the_issues_transposed_input_keeps_its_layout_real_and_fake(offset):
    from torch._subclasses.fake_tensor import FakeTensorMode

    x = torch.randn(2, 8, 4, 16).transpose(1, 2)
    w = torch.randn(16)
    # the two CPU paths disagree on their own: ATen's kernel returns a contiguous tensor
    assert torch.rms_norm(x, (16,), w, 1e-6).stride() == (512, 128, 16, 1)
    assert reference.rms_norm(x, w, 1e-6, offset).stride() == (512, 16, 64, 1)
    assert OPS.rms_norm(x, w, 1e-6, offset).stride() == (512, 16, 64, 1)
    with FakeTensorMode() as mode:
        fake = OPS.rms_norm(mode.from_tensor(x), mode.from_tensor(w), 1e-6, offset)
    assert fake.stride() == (512, 16, 64, 1)
    normed, total = OPS.fused_add_rmsnorm(x, torch.randn(2, 4, 8, 16), w, 1e-6, offset)
    assert normed.stride() == total.stride() == (512, 16, 64, 1)  # x's layout decides ties


def test_sliced_input_gets_a_dense_layout_in_its_dimension_order():
    x = torch.randn(2, 8, 4, 32).transpose(1, 2)[..., :16]  # not dense
    w = torch.randn(16)
    out = OPS.rms_norm(x, w, 1e-6)
    assert out.stride() == (512, 16, 64, 1) and not out.is_contiguous()
    torch.testing.assert_close(out, _contract_rms(x, w, 1e-6))


@pytest.mark.parametrize("layout", ["transposed", "sliced"])
def test_gradients_come_back_in_their_inputs_layout(layout):
    # torch.autograd.grad hands back what the backward returns (accumulating into a leaf's
    # .grad would impose the leaf's own layout contract on top)
    wide = 16 if layout == "transposed" else 32
    x = torch.randn(2, 8, 4, wide).transpose(1, 2)[..., :16].requires_grad_()
    r = torch.randn(2, 4, 8, 16, requires_grad=True)
    w = torch.randn(16, requires_grad=True)
    dense = (512, 16, 64, 1)  # x's layout, made dense
    dx, dw = torch.autograd.grad(OPS.rms_norm(x, w, 1e-6, 1.0).sum(), (x, w))
    assert dx.stride() == dense and dw.stride() == (1,)
    normed, total = OPS.fused_add_rmsnorm(x, r, w, 1e-6)
    dx, dr = torch.autograd.grad(normed.sum() + total.sum(), (x, r))
    assert dx.stride() == dense and dr.stride() == r.stride()
    _, total = OPS.fused_add_rmsnorm_quant(x, r, w, torch.tensor([0.1]), 1e-6)
    dx, dr = torch.autograd.grad(total.sum(), (x, r))
    assert dx.stride() == dense and dr.stride() == r.stride()


def test_in_place_variant_refuses_an_expanded_argument_at_trace_time_too():
    from torch._subclasses.fake_tensor import FakeTensorMode

    x = torch.randn(1, 16).expand(4, 16)
    r, w = torch.randn(4, 16), torch.ones(16)
    with pytest.raises(RuntimeError, match="x is an expanded view .* x.clone()"):
        OPS.fused_add_rmsnorm_(x, r, w, 1e-6)
    with FakeTensorMode() as mode, pytest.raises(RuntimeError, match="expanded view"):
        OPS.fused_add_rmsnorm_(*(mode.from_tensor(t) for t in (x, r, w)), 1e-6)


def test_gradients_match_finite_differences():
    x, r, w = (t.double().requires_grad_() for t in _inputs(dtype=torch.float32, shape=(2, 8)))
    assert torch.autograd.gradcheck(lambda x, w: OPS.rms_norm(x, w, 1e-6, 0.5), (x, w))
    assert torch.autograd.gradcheck(lambda x, r, w: OPS.fused_add_rmsnorm(x, r, w, 1e-6), (x, r, w))
    _, total = OPS.fused_add_rmsnorm_quant(x, r, w, torch.tensor([0.1]), 1e-6)
    total.sum().backward()
    assert torch.equal(x.grad, torch.ones_like(x))


class _UsesAll(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(1 + 0.1 * torch.randn(16))
        self.register_buffer("scale", torch.tensor([0.05]))

    def forward(self, x, r):
        a = OPS.rms_norm(x, self.w, 1e-6)
        n, t = OPS.fused_add_rmsnorm(a, r, self.w, 1e-5, 1.0)
        return OPS.fused_add_rmsnorm_quant(n, t, self.w, self.scale, 1e-5)


class _InPlace(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(1 + 0.1 * torch.randn(16))

    def forward(self, x, r):
        x, r = x * 2, r + 1
        OPS.fused_add_rmsnorm_(x, r, self.w, 1e-6)
        return x, r


def _targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def test_ops_survive_export_and_core_aten_decomposition():
    x, r, _ = _inputs((2, 4, 16), torch.float32)
    model = _UsesAll()
    ep = torch.export.export(model, (x, r)).run_decompositions()
    targets = _targets(ep.graph_module)
    assert OPS.rms_norm.default in targets and OPS.fused_add_rmsnorm_quant.default in targets
    for got, want in zip(ep.module()(x, r), model(x, r)):
        assert torch.equal(got, want)


def test_in_place_op_is_auto_functionalized_by_export():
    from torch._higher_order_ops.auto_functionalize import auto_functionalized_v2

    x, r, _ = _inputs((2, 4, 16), torch.float32)
    model = _InPlace()
    ep = torch.export.export(model, (x, r)).run_decompositions()
    assert auto_functionalized_v2 in _targets(ep.graph_module)
    for got, want in zip(ep.module()(x, r), model(x, r)):
        assert torch.equal(got, want)


@pytest.mark.parametrize("model_cls", [_UsesAll, _InPlace])
def test_ops_run_under_torch_compile_inductor(model_cls):
    torch._dynamo.reset()
    x, r, _ = _inputs((2, 4, 16), torch.float32)
    model = model_cls()
    with torch.no_grad():
        want = model(x, r)
        got = torch.compile(model, backend="inductor")(x, r)
    for g, w in zip(got, want):
        assert torch.equal(g, w)


# ----- CUDA: the Triton kernel against the reference -------------------------------------
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n", [16, 100, 4096, 5120, 20000])
def test_triton_kernels_match_reference(dtype, n):
    from fxpass.ops import kernel_for

    x, r, w = (t.cuda() for t in _inputs((3, 5, n), dtype))
    assert kernel_for(x) == "triton"
    tol = dict(rtol=TOL[dtype], atol=TOL[dtype])
    torch.testing.assert_close(
        OPS.rms_norm(x, w, 1e-6, 1.0), reference.rms_norm(x, w, 1e-6, 1.0), **tol
    )
    normed, total = OPS.fused_add_rmsnorm(x, r, w, 1e-6)
    ref_n, ref_t = reference.fused_add_rmsnorm(x, r, w, 1e-6)
    assert torch.equal(total, ref_t)
    torch.testing.assert_close(normed, ref_n, **tol)
    scale = torch.tensor([0.02], device="cuda")
    q, _ = OPS.fused_add_rmsnorm_quant(x, r, w, scale, 1e-6)
    ref_q, _ = reference.fused_add_rmsnorm_quant(x, r, w, scale, 1e-6)
    assert (q.int() - ref_q.int()).abs().max() <= 1
    assert (q != ref_q).float().mean() < 0.01
    x2, r2 = x.clone(), r.clone()
    OPS.fused_add_rmsnorm_(x2, r2, w, 1e-6)
    torch.testing.assert_close(x2, ref_n, **tol)
    assert torch.equal(r2, ref_t)


@cuda
def test_triton_kernel_handles_strided_inputs():
    x, r, w = (t.cuda() for t in _inputs((4, 64), torch.bfloat16))
    xt = x.t().contiguous().t()  # same values, column-major: the output is column-major too
    out = OPS.rms_norm(xt, w, 1e-6)
    assert out.stride() == xt.stride()
    torch.testing.assert_close(out, reference.rms_norm(x, w, 1e-6))
    x4 = torch.randn(2, 8, 4, 64, device="cuda").transpose(1, 2)  # per-head q/k norm layout
    normed, total = OPS.fused_add_rmsnorm(x4, x4.flip(0), w, 1e-6, 1.0)
    ref_n, ref_t = reference.fused_add_rmsnorm(x4, x4.flip(0), w, 1e-6, 1.0)
    assert normed.stride() == total.stride() == ref_n.stride() == x4.stride()
    torch.testing.assert_close(normed, ref_n)
    assert torch.equal(total, ref_t)
    x2 = x[:, :32]  # a row-strided view, normalized in place
    r2 = r[:, :32].clone()
    normed, total = reference.fused_add_rmsnorm(x2, r2, w[:32], 1e-6)
    OPS.fused_add_rmsnorm_(x2, r2, w[:32], 1e-6)
    torch.testing.assert_close(x[:, :32], normed)
    assert torch.equal(r2, total)
