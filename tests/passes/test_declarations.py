"""Every library pass declares the node metadata it keeps (``keeps=``) and the analyses it
preserves (``preserves=``), and the declarations hold on real graphs of every IR: the
pipeline runs here hold each pass to them (``keeps_metadata``, and the preserved analyses
are computed again after each pass — the test suite sets ``FXPASS_VERIFY_ANALYSES``)."""

from __future__ import annotations

import pytest

import fxpass as fp
from fxpass.core.analysis_manager import preserved_names
from fxpass.core.contract import METADATA
from fxpass.core.pass_registry import REGISTRY
from fxpass.verify.testing import capture, check_pass

from _models import decoder

# Library passes that declare nothing yet, with the reason; a new pass is not added here.
UNDECLARED: dict[str, str] = {}


def _library_passes():
    return [
        i
        for i in REGISTRY.infos()
        if getattr(i.target, "__module__", "").startswith("fxpass.passes.")
    ]


def test_every_library_pass_declares_what_it_keeps():
    infos = _library_passes()
    assert len(infos) >= 13
    undeclared = {i.name for i in infos if not getattr(i.target, "keeps", None)}
    assert undeclared == set(UNDECLARED)
    for info in infos:
        keeps = frozenset(getattr(info.target, "keeps", ()))
        assert keeps <= set(METADATA), info.name
        preserved_names(getattr(info.target, "preserves", ()))  # analyses or their names


def test_the_cleanups_keep_everything_and_preserve_positions_and_aliasing():
    for name in ("remove_assert_ops", "remove_detach", "remove_noop", "cse", "dce"):
        p = REGISTRY.create(name)
        assert p.keeps == frozenset(METADATA), name
        assert {"positions", "aliasing"} <= preserved_names(p.preserves), name


@pytest.mark.parametrize("ir", ["aot", "dynamo"])
def test_the_default_pipeline_keeps_its_declarations_in_every_ir(ir):
    model = decoder(layers=1)
    captured = capture(model, model.example_inputs(), ir)
    check = check_pass("default", captured, numerics=True)  # contracts=True: keeps_metadata
    assert check.report.find("fuse_add_rmsnorm").modified


def test_analyses_are_served_across_the_default_pipeline(llama_gm):
    result = fp.Pipeline(["default"], verify_analyses=True).run(llama_gm)
    counts = result.report.analysis_counts()
    assert counts["cse"]["aliasing"] == [1, 0]
    assert counts["dce"]["aliasing"] == [0, 1]  # cse's merges were taken in, not recomputed
