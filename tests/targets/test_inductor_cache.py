"""Inductor's cache and fxpass: a cache hit says the passes were cached and shows the report
recorded when they ran; editing a pass invalidates exactly the cached graphs it ran on."""

from __future__ import annotations

import sys
import textwrap
import uuid

import pytest
import torch
from _target_models import convnet

import fxpass as fp
from fxpass.targets.inductor_cache import CACHED_BY

_PASSES = """
import torch

TAG = {tag!r}  # a fresh Inductor cache for every test run


def relu_to_clamp(gm):
    for node in list(gm.graph.find_nodes(op="call_function", target=torch.ops.aten.relu.default)):
        with gm.graph.inserting_before(node):
            new = gm.graph.call_function(torch.ops.aten.clamp_min.default, (node.args[0], 0.0))
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
    return TAG is None


def look(gm):
    return {look_body}
"""


@pytest.fixture
def user_passes(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    tag = uuid.uuid4().hex
    name = f"fxpass_test_inductor_passes_{tag[:8]}"

    def load(look_body: str = "False"):
        (tmp_path / f"{name}.py").write_text(
            textwrap.dedent(_PASSES.format(tag=tag, look_body=look_body))
        )
        sys.modules.pop(name, None)
        return __import__(name)

    yield load
    sys.modules.pop(name, None)


def _compile(pipelines) -> fp.targets.backend.FxpassBackend:
    torch._dynamo.reset()
    model = convnet()
    (x,) = model.example_inputs()
    be = fp.backend(pipelines=pipelines)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(model, backend=be)(x), model(x))
    return be


def test_a_cache_hit_shows_the_report_recorded_when_the_passes_ran(user_passes, monkeypatch):
    mod = user_passes()
    pipelines = {"post_grad_custom_post_pass": [mod.relu_to_clamp]}
    first = _compile(pipelines)
    (ran,) = first.reports
    assert ran.cached == "" and ran.find("relu_to_clamp").modified
    hit = _compile(pipelines)
    (cached,) = hit.reports
    assert cached.cached == CACHED_BY
    assert "cached: the passes did not run; the result came from Inductor's cache" in str(cached)
    assert cached.to_dict()["root"] == ran.to_dict()["root"]  # the recorded report
    monkeypatch.setattr(  # as if another program had filled Inductor's cache
        "fxpass.core.cache.ReportStore.load", lambda self, key: None
    )
    (unrecorded,) = _compile(pipelines).reports
    assert unrecorded.cached == CACHED_BY and "was not recorded" in unrecorded.root.notes[0]
    assert unrecorded.where["hook"] == "post_grad_custom_post_pass"


def test_editing_a_pass_invalidates_exactly_the_caches_it_ran_in(user_passes):
    mod = user_passes()
    with_relu = {"post_grad_custom_post_pass": [mod.relu_to_clamp]}
    with_look = {"post_grad_custom_pre_pass": [mod.look]}
    assert _compile(with_relu).reports[0].cached == ""
    assert _compile(with_look).reports[0].cached == ""
    mod = user_passes(look_body="None")  # edit look, in the same file as relu_to_clamp
    with_relu = {"post_grad_custom_post_pass": [mod.relu_to_clamp]}
    with_look = {"post_grad_custom_pre_pass": [mod.look]}
    assert _compile(with_relu).reports[0].cached == CACHED_BY  # untouched: still cached
    assert _compile(with_look).reports[0].cached == ""  # edited: its graph compiles again
    assert _compile(with_look).reports[0].cached == CACHED_BY
