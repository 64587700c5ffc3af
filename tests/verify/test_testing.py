from __future__ import annotations

import pytest
import torch
from torch import fx

from fxpass.verify import Captured, capture, check_pass, count_ops, op_counts
from fxpass.verify.testing import UPDATE_ENV

aten = torch.ops.aten
RELUS = (aten.relu.default, torch.relu, torch.nn.functional.relu)


class TwiceRelu(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        h = self.lin(x)
        return torch.relu(h) + torch.relu(h)

    def example_inputs(self):
        return (torch.randn(2, 8, generator=torch.Generator().manual_seed(0)),)


def dedupe_relu(gm: fx.GraphModule) -> bool:
    """Merge relu calls on the same input (a tiny CSE, whatever the capture's IR)."""
    seen: dict = {}
    changed = False
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target in RELUS:
            key = (node.target, node.args)
            if key in seen:
                node.replace_all_uses_with(seen[key])
                gm.graph.erase_node(node)
                changed = True
            else:
                seen[key] = node
    return changed


def _relu_key(how: str):
    return "aten.relu" if how in ("export", "export_ir", "aot") else torch.relu


@pytest.mark.parametrize("how", ["export", "aot", "dynamo", "trace"])
def test_every_capture(how: str):
    model = TwiceRelu().eval()
    key = _relu_key(how)
    check = check_pass(
        dedupe_relu,
        model,
        capture_with=how,
        before={key: 2},
        after={key: 1},
        modified=True,
    )
    assert check.comparison.ok
    assert check.captured.how == how
    assert count_ops(check.graph_module, key) == 1
    assert sum(check.counts_before.values()) == sum(check.counts_after.values()) + 1


def test_failed_expectations_say_what_was_expected():
    model = TwiceRelu().eval()
    captured = capture(model, model.example_inputs(), "export")
    with pytest.raises(AssertionError) as info:
        check_pass(dedupe_relu, captured, after={"aten.relu.default": 2},
                   absent_after=[aten.relu.default], modified=False)  # fmt: skip
    message = str(info.value)
    assert "expected 2 x aten.relu.default after the pass, found 1" in message
    assert "expected no aten.relu.default after the pass, found 1" in message
    assert "expected modified=False, the pass reported True" in message


def _wrong_relu(gm: fx.GraphModule) -> bool:
    for node in gm.graph.nodes:
        if node.target is aten.relu.default:
            node.target = aten.sigmoid.default
            return True
    return False


def test_numerics_are_checked():
    model = TwiceRelu().eval()
    with pytest.raises(AssertionError, match="numerics differ after the pass: output 0 at"):
        check_pass(_wrong_relu, model)
    check_pass(_wrong_relu, model, numerics=False)


def test_snapshots(tmp_path, monkeypatch):
    model = TwiceRelu().eval()
    captured = capture(model, model.example_inputs(), "export")
    snap = tmp_path / "snaps" / "dedupe.txt"

    def fresh() -> Captured:
        return capture(model, model.example_inputs(), "export")

    check_pass(dedupe_relu, captured, snapshot=snap)
    assert "aten.relu.default" in snap.read_text()
    check_pass(dedupe_relu, fresh(), snapshot=snap)  # same graph: passes
    snap.write_text(snap.read_text().replace("relu", "gelu"))
    with pytest.raises(AssertionError, match=f"set {UPDATE_ENV}=1 to accept"):
        check_pass(dedupe_relu, fresh(), snapshot=snap)
    monkeypatch.setenv(UPDATE_ENV, "1")
    check_pass(dedupe_relu, fresh(), snapshot=snap)
    assert "gelu" not in snap.read_text()


def test_op_counts_and_keys():
    model = TwiceRelu().eval()
    gm = capture(model, model.example_inputs(), "export").graph_module
    counts = op_counts(gm)
    assert counts["aten.relu.default"] == 2
    assert count_ops(gm, aten.relu) == count_ops(gm, "aten.relu") == 2
    assert count_ops(gm, aten.relu.default) == count_ops(gm, "aten.relu.default") == 2
    assert count_ops(gm, "aten.re") == 0  # a prefix of a name is not a match
    with pytest.raises(ValueError, match="unknown capture"):
        capture(model, model.example_inputs(), "onnx")
