"""remove_detach: detach goes wherever it appears, but an input never becomes an output."""

from __future__ import annotations

import pytest
import torch
from _cleanup_helpers import calls

import fxpass as fp
from fxpass.verify.testing import capture, check_pass


class _Detaches(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        h = self.lin(x).detach()
        return (torch.detach(h * 2) + x.detach(),)


@pytest.mark.parametrize("how", ["export_ir", "aot", "dynamo", "trace"])
def test_detach_goes(how):
    c = capture(_Detaches(), (torch.randn(2, 4),), how)
    before = calls(c.graph_module, "detach")
    if before == 0:
        pytest.skip(f"{how} capture leaves no detach")
    check = check_pass("remove_detach", c, modified=True)
    assert calls(check.graph_module, "detach") == 0
    assert check.report.root.children[0].stats == {"removed": before}


class _ReturnsDetachedInput(torch.nn.Module):
    def forward(self, x):
        return (x.detach(), (x * 2).detach())


def test_a_detached_input_is_not_returned_as_the_input():
    c = capture(_ReturnsDetachedInput(), (torch.randn(3),), "dynamo")
    result = fp.Pipeline.parse("remove_detach").run(c.graph_module)
    assert calls(c.graph_module, "detach") == 1
    assert result.report.root.children[0].stats == {"removed": 1}
