"""The one import rule's helpers: which op a failed load lacks, and who registers it."""

from __future__ import annotations

import pytest

from fxpass.core.imports import op_registrars, unknown_op


def _raised(*messages: str) -> BaseException:
    """An exception raised from the ones before it (the last message is the outermost)."""
    error: BaseException | None = None
    for message in messages:
        try:
            raise RuntimeError(message) from error
        except RuntimeError as e:
            error = e
    assert error is not None
    return error


@pytest.mark.parametrize(
    ("messages", "op"),
    [
        (["Could not resolve torch.ops.mylib.twice.default to an operator"], "mylib::twice"),
        (["Could not resolve torch.ops.mylib.twice to an operator", "cannot load x.pt2"],
         "mylib::twice"),
        (["shape mismatch", "cannot load x.pt2"], None),
        (["torch.ops.mylib.twice is mentioned, but not as unresolved"], None),
    ],
)  # fmt: skip
def test_unknown_op_is_read_from_the_chain_of_causes(messages, op):
    assert unknown_op(_raised(*messages)) == op


def test_op_registrars_reads_sources_and_imports_nothing(tmp_path, monkeypatch):
    import sys

    (tmp_path / "fxpreg_ops.py").write_text(
        'import torch\n@torch.library.custom_op("fxpreg::twice", mutates_args=())\n'
        "def twice(x: torch.Tensor) -> torch.Tensor:\n    return x * 2\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert op_registrars("fxpreg::twice") == ["fxpreg_ops"]
    assert "fxpreg_ops" not in sys.modules
    assert op_registrars("fxpreg::" + "th" + "rice") == []  # not spelled whole in any source
