"""fxutil.views: the view <-> *_copy table read off torch's ops, and which shape-only ops
keep a tensor's rows (checked on exported graphs, ATen and Edge)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fxpass.fxutil.views import (
    always_view,
    copy_variant,
    keeps_rows,
    returns_view,
    shares_storage,
    view_base_name,
    view_variant,
)

aten = torch.ops.aten


def test_every_view_has_its_copy_variant_and_back():
    pairs = {
        aten.view.default: aten.view_copy.default,
        aten.permute.default: aten.permute_copy.default,
        aten.expand.default: aten.expand_copy.default,
        aten.unsqueeze.default: aten.unsqueeze_copy.default,
        aten.squeeze.dim: aten.squeeze_copy.dim,
        aten.slice.Tensor: aten.slice_copy.Tensor,
        aten.select.int: aten.select_copy.int,
        aten.transpose.int: aten.transpose_copy.int,
        aten.t.default: aten.t_copy.default,
        aten.alias.default: aten.alias_copy.default,
        aten.split_with_sizes.default: aten.split_with_sizes_copy.default,
    }
    for view, copy in pairs.items():
        assert copy_variant(view) is copy and view_variant(copy) is view
    assert copy_variant(aten.add.Tensor) is None and view_variant(aten.view.default) is None
    assert view_variant(aten.index_copy.default) is None  # index is no view


def test_edge_copies_are_their_aten_copies():
    pytest.importorskip("executorch.exir")
    from executorch.exir.dialects._ops import ops as exir_ops

    assert view_variant(exir_ops.edge.aten.view_copy.default) is aten.view.default
    assert copy_variant(exir_ops.edge.aten.permute.default) is aten.permute_copy.default


_SHAPES = {  # name -> the shape-only op; ``keep_*`` keep the rows of x: [2, 3, 8]
    "keep_reshape": lambda x: x.reshape(6, 8),
    "keep_unsqueeze": lambda x: x.unsqueeze(0),
    "keep_permute": lambda x: x.permute(1, 0, 2),
    "keep_transpose": lambda x: x.transpose(0, 1),
    "keep_slice": lambda x: x[:, 1:],
    "keep_select": lambda x: x.select(1, 0),
    "keep_expand": lambda x: x.unsqueeze(0).expand(4, 2, 3, 8),
    "mix_reshape": lambda x: x.reshape(2, 24),
    "mix_permute": lambda x: x.permute(0, 2, 1),
    "mix_slice": lambda x: x[..., :4],
    "mix_view_dtype": lambda x: x.view(torch.int32),
}


class Shapes(nn.Module):
    def forward(self, x):
        return tuple(op(x) + 1 for op in _SHAPES.values())


def _shape_nodes(ep):
    """The node each entry of _SHAPES made (what the ``+ 1`` reads)."""
    adds = [o.args[0] for o in ep.graph.output_node().args[0]]
    return dict(zip(_SHAPES, adds))


@pytest.mark.parametrize("dialect", ["aten", "edge"])
def test_keeps_rows(dialect):
    ep = torch.export.export(Shapes(), (torch.randn(2, 3, 8),))
    if dialect == "edge":
        pytest.importorskip("executorch.exir")
        from executorch.exir import EdgeCompileConfig, to_edge

        config = EdgeCompileConfig(_core_aten_ops_exception_list=[aten.view.dtype])
        ep = to_edge(ep, compile_config=config).exported_program()
    for name, node in _shape_nodes(ep).items():
        if name == "mix_view_dtype":
            if dialect == "edge":  # Edge reads it through an alias_copy
                node = node.args[0]
            assert view_base_name(node) is None
        assert keeps_rows(node) is name.startswith("keep"), (name, node.format_node())
    if dialect == "edge":
        names = {view_base_name(n) for n in ep.graph.nodes if n.op == "call_function"}
        assert {"view", "permute", "slice", "select", "expand", "unsqueeze"} <= names


# ----- view or copy: torch's kernels decide, on meta tensors -----------------------------------
@pytest.mark.parametrize(
    "op, args, kwargs, view",
    [
        (aten.reshape.default, (torch.empty(2, 4, 8), [8, 8]), {}, True),
        (aten.reshape.default, (torch.empty(2, 4, 1, 8).expand(2, 4, 3, 8), [2, 12, 8]), {}, False),
        (aten.reshape.default, (torch.empty(4, 8).t(), [32]), {}, False),
        (aten.reshape.default, (torch.empty(4, 8).t(), [2, 4, 4]), {}, True),  # splits a dim
        (aten.flatten.using_ints, (torch.empty(4, 8).t(),), {}, False),
        (aten.contiguous.default, (torch.empty(4, 8),), {}, True),
        (aten.contiguous.default, (torch.empty(4, 8)[:, ::2],), {}, False),
        (aten.to.dtype, (torch.empty(4), torch.float32), {}, True),
        (aten.to.dtype, (torch.empty(4), torch.float16), {}, False),
        (aten.to.dtype_layout, (torch.empty(4),), {"device": torch.device("cpu")}, True),
        (aten.to.device, (torch.empty(4), torch.device("cuda"), torch.float32), {}, False),
        (aten.view_as.default, (torch.empty(4, 8), torch.empty(32)), {}, True),
        (aten.add.Tensor, (torch.empty(4), torch.empty(4)), {}, False),
    ],
)
def test_returns_view_is_what_torch_does(op, args, kwargs, view):
    assert returns_view(op, args, kwargs) is view
    if not any(isinstance(a, torch.device) and a.type == "cuda" for a in args):
        out = op(*args, **kwargs)  # the real op agrees
        assert shares_storage(out, args[0]) is view


def test_returns_view_cannot_tell_without_static_layouts():
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    mode = FakeTensorMode(shape_env=ShapeEnv())
    x = mode.from_tensor(torch.empty(4, 8), static_shapes=False)
    assert returns_view(aten.reshape.default, (x, [32])) is None
    assert returns_view(aten.reshape.default, (torch.fx.Graph().placeholder("x"), [32])) is None
    assert returns_view(aten.reshape.default, (torch.empty(4, 8), [5])) is None  # refuses


def test_always_views_and_fake_values_keep_aliasing():
    assert always_view(aten.expand.default) and always_view(aten.split_with_sizes.default)
    assert not always_view(aten.reshape.default) and not always_view(aten.contiguous.default)
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(2, 4, 8)
        e = x[:, :, None].expand(2, 4, 3, 8)
        assert shares_storage(e, x) and not shares_storage(e.reshape(2, 12, 8), e)
    assert not shares_storage(torch.empty(2), 3)
