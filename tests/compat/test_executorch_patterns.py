"""XNNPACK's pattern graphs built only for graphs that could hold them (install()).

The lowering runs in fresh interpreters (install() is process-wide): with install(), a model
without an upsample or an attention builds neither pattern set, a model with an upsample
builds the bilinear patterns and writes the same program as ExecuTorch alone; on a release
:data:`RELEASES` does not name, nothing is wrapped and the patterns are built as ExecuTorch
builds them. In this process: the operators :data:`NEEDS` names are in every real pattern.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import fx

pytest.importorskip("executorch.exir")

from fxpass.compat.executorch._patterns import (
    NEEDS,
    known_release,
    lazy_patterns,
    withheld,
)

SRC = Path(__file__).resolve().parents[2] / "src"

_SCRIPT = """
import sys
release_known = sys.argv[2] == "known"
if sys.argv[1] != "executorch":
    import fxpass.compat.executorch as fxet
    from fxpass.compat.executorch import _patterns
    if not release_known:
        _patterns.RELEASES = ()  # as on a release NEEDS was not checked on
    fxet.install()

import torch
from executorch.backends.xnnpack._passes.convert_to_sdpa import ConvertToSDPAPass
from executorch.backends.xnnpack.partition.graphs import bilinear_2d, sdpa
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir import to_edge_transform_and_lower


def built():
    # the getters cache what they build: whether each pattern set was built by now
    bilinear = bilinear_2d._get_bilinear_2d_graphs.cache_info().currsize
    getter = sdpa.get_graphs  # ExecuTorch's lru_cache, or fxpass's function around it
    getter = getter if hasattr(getter, "cache_info") else getter.__wrapped__
    attention = getter.cache_info().currsize
    return bilinear, attention


class Upsample(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        y = torch.nn.functional.interpolate(self.conv(x), scale_factor=2, mode="bilinear")
        return torch.relu(y)


def lower(model, x):
    lowered = to_edge_transform_and_lower(
        torch.export.export(model, (x,)), partitioner=[XnnpackPartitioner()]
    )
    return lowered.to_executorch().buffer


torch.manual_seed(0)
linear = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU()).eval()
lower(linear, torch.randn(4, 16))
print("after linear:", *built())
torch.manual_seed(0)  # ExecuTorch's pattern builds draw from torch's generator
program = lower(Upsample().eval(), torch.randn(1, 3, 8, 8))
print("after upsample:", *built())
open(sys.argv[3], "wb").write(program)
if sys.argv[1] != "executorch":
    wrapped = hasattr(ConvertToSDPAPass.call, "__wrapped__")
    fxet.uninstall()
    restored = not hasattr(ConvertToSDPAPass.call, "__wrapped__")
    restored = restored and not hasattr(bilinear_2d.get_graphs_dict, "__wrapped__")
    print("wrapped:", wrapped)
    print("restored:", restored)
"""


def _run(kind: str, release: str, out: Path) -> dict[str, str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT, kind, release, str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-5000:]
    lines = [line.partition(": ") for line in proc.stdout.splitlines() if ": " in line]
    return {key: value for key, _, value in lines}


@pytest.fixture(scope="module")
def pattern_runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("patterns")
    got = {}
    for kind, release in (("executorch", "known"), ("fxpass", "known"), ("fxpass", "other")):
        out = folder / f"{kind}-{release}.pte"
        got[kind, release] = (_run(kind, release, out), out.read_bytes())
    return got


@pytest.mark.skipif(not known_release(), reason="NEEDS was checked on another release")
def test_install_builds_the_patterns_only_for_a_graph_that_could_hold_them(pattern_runs):
    printed, program = pattern_runs["fxpass", "known"]
    assert printed["after linear"] == "0 0"  # neither an upsample nor an attention
    assert printed["after upsample"] == "1 0"  # the upsample's delegate needs its patterns
    assert printed["wrapped"] == "True" and printed["restored"] == "True"
    assert program == pattern_runs["executorch", "known"][1]


def test_executorch_alone_builds_every_pattern(pattern_runs):
    printed, _ = pattern_runs["executorch", "known"]
    assert printed["after linear"] == "1 1"


def test_on_another_release_nothing_is_wrapped(pattern_runs):
    printed, program = pattern_runs["fxpass", "other"]
    assert printed["after linear"] == "1 1"  # built as ExecuTorch builds them
    assert printed["wrapped"] == "False" and printed["restored"] == "True"
    assert program == pattern_runs["executorch", "known"][1]


def test_known_release():
    assert known_release("1.5.1", "2.13.0+cpu")
    assert not known_release("1.6.0", "2.13.0+cpu")
    assert not known_release("1.5.1", "2.14.0")


@pytest.mark.skipif(not known_release(), reason="NEEDS was checked on another release")
@pytest.mark.parametrize("module", sorted(NEEDS))
def test_every_real_pattern_holds_the_operators_named(module):
    import importlib

    from torch.fx.passes.utils.matcher_utils import SubgraphMatcher

    patterns = NEEDS[module]
    graphs = getattr(importlib.import_module(patterns.graphs), patterns.getter)()
    assert isinstance(graphs, patterns.empty) and len(graphs) > 0
    for gm in graphs:
        matcher = SubgraphMatcher(gm.graph, ignore_literals=True)
        # one output, fed by every node: a match maps every node of the pattern
        assert matcher.pattern_anchors == matcher.pattern_returning_nodes
        assert len(matcher.pattern_anchors) == 1
        names = {n.target.__name__ for n in gm.graph.nodes if n.op == "call_function"}
        assert patterns.needs <= names, sorted(patterns.needs - names)


def _op(name):
    def op(x):
        return x

    op.__name__ = name
    return op


def _graph(*names: str) -> fx.GraphModule:
    graph = fx.Graph()
    x = graph.placeholder("x")
    for name in names:
        x = graph.call_function(_op(name), (x,))
    graph.output(x)
    return fx.GraphModule(torch.nn.Module(), graph)


def test_a_pass_sees_the_patterns_only_on_a_graph_with_every_needed_operator():
    built = []

    def getter():
        built.append(1)
        return ["pattern"]

    patterns = withheld(getter, list)

    class Pass:
        fail = False

        def call(self, gm):
            if self.fail:
                raise ValueError("the pass failed")
            return patterns()

    call = lazy_patterns(Pass.call, frozenset({"aten.a.default", "aten.b.default"}))
    assert call(Pass(), _graph("aten.a.default")) == [] and built == []
    assert call(Pass(), _graph("aten.b.default", "aten.a.default")) == ["pattern"]
    assert built == [1]
    assert patterns() == ["pattern"]  # outside a wrapped pass: ExecuTorch's answer
    failing = Pass()
    failing.fail = True
    with pytest.raises(ValueError, match="the pass failed"):
        call(failing, _graph("aten.a.default"))
    assert patterns() == ["pattern"]  # a failed pass leaves nothing withheld
