"""Operator support: op sets, value predicates, composition, the spec language."""

from __future__ import annotations

import operator
import re

import pytest
import torch
from torch import fx, nn
from torch.fx.passes import operator_support as torch_support

from fxpass.partition import (
    OperatorSupport,
    OperatorSupportBase,
    SupportSpecError,
    any_chain,
    chain,
    dtype_support,
    named_support,
    node_support,
    op_support,
    parse_support,
    shape_support,
)

import _models

aten = torch.ops.aten


@pytest.fixture(scope="module")
def gm() -> fx.GraphModule:
    return _models.exported_gm(remove_asserts=True)


def supported(support, gm) -> list[fx.Node]:
    return [n for n in gm.graph.nodes if support.is_node_supported({}, n)]


def targets(nodes) -> set:
    return {n.target for n in nodes}


def test_op_support_matches_overloads_packets_names_and_functions(gm):
    by_overload = supported(op_support(aten.add.Tensor), gm)
    assert by_overload and targets(by_overload) == {aten.add.Tensor}
    by_packet = supported(op_support(aten.mul), gm)
    assert targets(by_packet) == {aten.mul.Tensor, aten.mul.Scalar}
    by_name = supported(op_support("aten.mul", "torch.ops.aten.add.Tensor"), gm)
    assert targets(by_name) == {aten.mul.Tensor, aten.mul.Scalar, aten.add.Tensor}
    getitems = supported(op_support("getitem"), gm)
    assert getitems and targets(getitems) == {operator.getitem}
    # placeholders and the output never match an op set
    assert all(n.op == "call_function" for n in by_name)


def test_op_support_matches_module_types_on_call_module_nodes():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    traced = fx.symbolic_trace(model)
    modules = dict(traced.named_modules())
    support = op_support(nn.Linear)
    hits = [n.target for n in traced.graph.nodes if support.is_node_supported(modules, n)]
    assert hits == ["0", "2"]


def test_unknown_op_names_fail_with_a_suggestion():
    with pytest.raises(ValueError, match=r"unknown op 'aten.rsqrtt'.*aten.rsqrt"):
        op_support("aten.rsqrtt")


def test_dtype_support_reads_meta_val(gm):
    float32 = supported(dtype_support(torch.float32), gm)
    # the norm's upcast: _to_copy to float32 and the float32 math after it
    assert aten._to_copy.default in targets(float32)
    assert all(n.meta["val"].dtype == torch.float32 for n in float32 if "val" in n.meta)
    bf16 = supported(dtype_support("bf16"), gm)
    assert not {n for n in bf16} & {n for n in float32 if n.op == "call_function"}
    # inputs=True: every tensor input is bfloat16
    for node in supported(dtype_support("bfloat16", inputs=True), gm):
        for arg in node.all_input_nodes:
            vals = arg.meta["val"] if isinstance(arg.meta["val"], list) else [arg.meta["val"]]
            assert all(v.dtype == torch.bfloat16 for v in vals if isinstance(v, torch.Tensor))


def test_dtype_support_unknown_values():
    graph = fx.Graph()
    x = graph.placeholder("x")
    relu = graph.call_function(torch.relu, (x,))
    graph.output(relu)
    assert not dtype_support(torch.float32).is_node_supported({}, relu)
    assert dtype_support(torch.float32, unknown=True).is_node_supported({}, relu)
    with pytest.raises(ValueError, match="unknown dtype 'floaty'"):
        dtype_support("floaty")


def test_shape_support(gm):
    rank2 = supported(shape_support(max_rank=2), gm)
    assert rank2
    for node in rank2:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            assert val.dim() <= 2
    wide = supported(shape_support(lambda shape: bool(shape) and shape[-1] == 128), gm)
    assert wide and all(n.meta["val"].shape[-1] == 128 for n in wide)


def test_composition_all_any_not(gm):
    add = op_support(aten.add.Tensor)
    f32 = dtype_support(torch.float32)
    both = set(supported(chain(add, f32), gm))
    assert both == set(supported(add & f32, gm))
    assert both == set(supported(add, gm)) & set(supported(f32, gm))
    either = set(supported(any_chain(add, f32), gm))
    assert either == set(supported(add | f32, gm))
    assert either == set(supported(add, gm)) | set(supported(f32, gm))
    assert set(supported(~add, gm)) == set(gm.graph.nodes) - set(supported(add, gm))


def test_node_support_wraps_functions(gm):
    by_name = node_support(lambda node: node.name.startswith("mul"))
    assert {n.name for n in supported(by_name, gm)} == {
        n.name for n in gm.graph.nodes if n.name.startswith("mul")
    }
    torch_style = node_support(
        lambda submodules, node: node.op == "placeholder", takes_submodules=True
    )
    assert all(n.op == "placeholder" for n in supported(torch_style, gm))


def test_named_supports(gm):
    elementwise = targets(supported(named_support("elementwise"), gm))
    assert {
        aten.add.Tensor,
        aten.mul.Tensor,
        aten.rsqrt.default,
        aten._to_copy.default,
    } <= elementwise
    assert aten.mm.default not in elementwise and aten.mean.dim not in elementwise
    assert aten.mean.dim in targets(supported(named_support("norm"), gm))
    views = targets(supported(named_support("view"), gm))
    assert {aten.view.default, aten.permute.default, operator.getitem} <= views
    assert supported(named_support("none"), gm) == []
    every = supported(named_support("all"), gm)
    assert {n.op for n in every} == {"call_function"}
    with pytest.raises(ValueError, match="did you mean elementwise"):
        named_support("elementwse")


def test_norm_support_includes_fxpass_ops():
    import fxpass.ops  # noqa: F401  (registers torch.ops.fxpass)

    graph = fx.Graph()
    x, w = graph.placeholder("x"), graph.placeholder("w")
    norm = graph.call_function(torch.ops.fxpass.rms_norm.default, (x, w, 1e-6))
    graph.output(norm)
    assert parse_support("norm").is_node_supported({}, norm)
    assert parse_support("ops(fxpass.rms_norm)").is_node_supported({}, norm)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("ops(aten.add.Tensor)", {aten.add.Tensor}),
        ("aten.add.Tensor | aten.rsqrt", {aten.add.Tensor, aten.rsqrt.default}),
        ("norm & !ops(aten.rsqrt)", {aten.mean.dim}),
        ("norm & not ops(aten.rsqrt)", {aten.mean.dim}),
        ("(pointwise & dtype(f32)) & ops(aten.rsqrt)", {aten.rsqrt.default}),
        ("ops(aten.mm) & max_rank(2)", {aten.mm.default}),
        ("ops(aten.mm) & input_dtype(bf16) & static_shape", {aten.mm.default}),
    ],
)
def test_spec_language(gm, text, expected):
    assert targets(supported(parse_support(text), gm)) == expected


def test_spec_forms_agree(gm):
    text = parse_support("ops(aten.add, aten.mul) & dtype(bf16)")
    as_dict = parse_support({"ops": ["aten.add", "aten.mul"], "dtypes": ["bf16"]})
    as_objects = op_support(aten.add, aten.mul) & dtype_support(torch.bfloat16)
    expected = supported(as_objects, gm)
    assert expected
    assert supported(text, gm) == expected
    assert supported(as_dict, gm) == expected
    # describe() prints text that parses back to the same decisions
    assert supported(parse_support(as_objects.describe()), gm) == expected


def test_dict_form(gm):
    spec = {
        "named": ["elementwise", "norm"],
        "ops": "aten.mm",
        "exclude_ops": ["aten._to_copy"],
        "max_rank": 3,
        "not": "ops(aten.neg)",
    }
    got = targets(supported(parse_support(spec), gm))
    assert aten.mm.default in got and aten.mean.dim in got and aten.add.Tensor in got
    assert aten._to_copy.default not in got and aten.neg.default not in got
    assert targets(supported(parse_support({"any": ["ops(aten.mm)", "ops(aten.bmm)"]}), gm)) == {
        aten.mm.default,
        aten.bmm.default,
    }
    assert supported(parse_support(["aten.mm"]), gm) == supported(op_support(aten.mm), gm)


@pytest.mark.parametrize(
    ("spec", "message", "column"),
    [
        ("elementwise |", "expected a support name", 14),
        ("elementwise & (norm", "expected ')'", 20),
        ("elementwse", "did you mean elementwise", 1),
        ("norm | ops(aten.nope)", "unknown op 'aten.nope'", 8),
        ("dtype(floaty)", "unknown dtype", 1),
        ("max_rank(x)", "max_rank takes one integer", 1),
        ("norm norm", "unexpected 'n'", 6),
        ("frob(aten.add)", "unknown support function 'frob'", 1),
        ("", "empty support spec", 1),
    ],
)
def test_spec_errors_point_at_the_problem(spec, message, column):
    with pytest.raises(SupportSpecError, match=re.escape(message)) as info:
        parse_support(spec)
    assert info.value.column == column


def test_bad_dict_key_and_bad_type():
    with pytest.raises(SupportSpecError, match="did you mean 'dtypes'"):
        parse_support({"dtype": ["bf16"]})
    with pytest.raises(TypeError, match="cannot make operator support from 3"):
        parse_support(3)


def test_interoperates_with_torch_support_objects(gm):
    ours = op_support(aten.add.Tensor)
    assert isinstance(ours, torch_support.OperatorSupportBase)

    class TorchRsqrt(torch_support.OperatorSupportBase):
        def is_node_supported(self, submodules, node):
            return node.op == "call_function" and node.target is aten.rsqrt.default

    mixed = ours | TorchRsqrt()
    assert targets(supported(mixed, gm)) == {aten.add.Tensor, aten.rsqrt.default}
    via_torch = torch_support.any_chain(ours, TorchRsqrt())
    assert supported(via_torch, gm) == supported(mixed, gm)
    assert supported(parse_support(TorchRsqrt()), gm) == supported(TorchRsqrt(), gm)


def test_support_dict_reads_dtypes_from_meta_val(gm):
    support = OperatorSupport(
        {
            "torch.ops.aten.mul.Tensor": ([[torch.float32], [torch.float32]], {}),
            "torch.ops.aten.rsqrt.default": None,
        }
    )
    hits = supported(support, gm)
    muls = [n for n in hits if n.target is aten.mul.Tensor]
    assert muls and all(
        a.meta["val"].dtype == torch.float32 for n in muls for a in n.args if isinstance(a, fx.Node)
    )
    assert any(n.target is aten.rsqrt.default for n in hits)
    # torch's rule: nodes that call nothing are supported
    assert all(
        n.op != "call_function" or n.target in (aten.mul.Tensor, aten.rsqrt.default) for n in hits
    )
    assert any(n.op == "placeholder" for n in hits)


def test_support_objects_are_callable_and_print_their_spec(gm):
    support = parse_support("elementwise | ops(aten.mm)")
    node = next(n for n in gm.graph.nodes if n.target is aten.mm.default)
    assert support(node)
    assert repr(support) == "<support elementwise | ops(aten.mm)>"
    assert isinstance(support, OperatorSupportBase)
