"""One run policy and one error for torch's and ExecuTorch's pass managers."""

from __future__ import annotations

import pytest
import torch
import torch.fx.passes.infra.pass_manager as torch_pm
from torch import fx, nn

from fxpass.compat import fx as compat
from fxpass.compat._policy import PASS_MANAGER, manager_rounds, pass_manager_error

pytest.importorskip("executorch.exir")

from fxpass.compat import executorch as et_compat


class _Add(nn.Module):
    def forward(self, x):
        return x + 1


def noop(gm):
    return None


def boom(gm):
    raise ValueError("bad")


def _message(run) -> tuple[str, type]:
    with pytest.raises(Exception) as info:
        run()
    return str(info.value), type(info.value.__cause__)


def test_every_manager_fails_with_torchs_message_word_for_word():
    torch_passes = [torch_pm.pass_result_wrapper(noop), torch_pm.pass_result_wrapper(boom)]
    ours = [compat.pass_result_wrapper(noop), compat.pass_result_wrapper(boom)]
    ep = torch.export.export(_Add(), (torch.randn(3),))
    messages = {
        "torch": _message(lambda: torch_pm.PassManager(torch_passes)(fx.symbolic_trace(_Add()))),
        "graph": _message(lambda: compat.PassManager(ours)(fx.symbolic_trace(_Add()))),
        "module": _message(lambda: compat.PassManager(ours)(_Add())),  # no graph to roll back
        "program": _message(lambda: et_compat.ExportedProgramPassManager([noop, boom])(ep)),
    }
    want = "An error occurred when running the 'boom' pass after the following passes: ['noop']"
    assert set(messages.values()) == {(want, ValueError)}


def test_the_error_names_the_passes_before_the_failing_one():
    names = ["a", "b", "c"]
    assert str(pass_manager_error(names, "c")).endswith("passes: ['a', 'b']")
    assert str(pass_manager_error(names, 1)).startswith("An error occurred when running the 'b'")
    assert str(pass_manager_error(names, "(input)")).endswith("passes: []")  # not a pass


def test_both_managers_check_after_passes_that_changed_nothing():
    """The policy both share: the check runs after every pass, changed or not."""
    checked = []
    graph_manager = compat.PassManager(
        [compat.pass_result_wrapper(noop)] * 2, run_checks_after_each_pass=True
    )
    graph_manager.add_checks(lambda gm: checked.append("graph"))
    graph_manager(fx.symbolic_trace(_Add()))

    class Counting(et_compat.ExportedProgramPassManager):
        def check(self, exported_program):
            checked.append("program")
            super().check(exported_program)

    ep = torch.export.export(_Add(), (torch.randn(3),))
    Counting([noop, noop], run_checks_after_each_pass=True)(ep)
    # the input once, each pass, and (ExecuTorch's) the result once more
    assert checked.count("graph") == 1 + 2
    assert checked.count("program") == 1 + 2 + 1


def test_the_rounds_follow_the_managers_settings():
    manager = compat.PassManager([], steps=3, suppress_check_failures=True)
    rounds = manager_rounds(manager, [], manager.check, "PassManager")
    assert rounds.max_iterations == 3 and rounds.suppress_check_failures
    assert rounds.policy is PASS_MANAGER and not rounds.lint
    assert not rounds.run_checks_after_each_pass
