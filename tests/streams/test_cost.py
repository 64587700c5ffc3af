"""The cost model: FLOPs and bytes from meta['val'], microseconds with a per-kernel floor."""

from __future__ import annotations

import pytest
import torch

from fxpass.streams import CostModel, node_bytes, node_flops


def _nodes(fn, *inputs) -> dict[str, torch.fx.Node]:
    class M(torch.nn.Module):
        def forward(self, *args):
            return fn(*args)

    gm = torch.export.export(M(), inputs).graph_module
    return {n.name: n for n in gm.graph.nodes}


def test_matmul_flops_and_bytes():
    a, b = torch.randn(32, 64), torch.randn(64, 16)
    mm = _nodes(torch.mm, a, b)["mm"]
    assert node_flops(mm) == 2 * 32 * 16 * 64
    assert node_bytes(mm) == 4 * (32 * 64 + 64 * 16 + 32 * 16)


def test_elementwise_counts_one_flop_per_element_and_views_are_free():
    nodes = _nodes(lambda x: x.t().sin(), torch.randn(8, 4))
    assert node_flops(nodes["sin"]) == 32
    model = CostModel()
    assert model.node_us(nodes["t"]) == 0.0  # a view runs no kernel
    assert model.node_us(nodes["sin"]) == model.kernel_us  # tiny: the floor


def test_big_work_costs_more_than_the_floor():
    a = torch.randn(1024, 1024)
    mm = _nodes(torch.mm, a, a)["mm"]
    model = CostModel(peak_flops=1e12, bandwidth=1e11)
    assert model.node_us(mm) == pytest.approx(2 * 1024**3 / 1e12 * 1e6)


@pytest.mark.parametrize("field", ["peak_flops", "bandwidth"])
def test_bad_device_numbers_are_refused(field):
    with pytest.raises(ValueError, match=f"CostModel.{field} must be positive"):
        CostModel(**{field: 0})


def test_a_reshape_that_copies_costs_a_kernel_and_one_that_views_is_free():
    def repeat_kv(k):
        return k.reshape(2, 256), k[:, :, None].expand(2, 2, 2, 8, 16).reshape(2, 4, 8, 16)

    nodes = _nodes(repeat_kv, torch.randn(2, 2, 8, 16))
    model = CostModel()
    assert model.node_us(nodes["reshape"]) == 0.0  # row-major: a view
    assert model.node_us(nodes["expand"]) == 0.0
    assert model.node_us(nodes["reshape_1"]) == model.kernel_us  # of the expand: a copy
