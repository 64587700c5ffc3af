"""Per-pass identity: a uuid from a pass's code, options and declarations that changes for
exactly the pass that was edited; and the structural hash of a graph."""

from __future__ import annotations

import copy
import sys
import textwrap

import pytest
import torch

import fxpass as fp
from fxpass.core.identity import graph_hash, pass_uuid, pipeline_uuid
from fxpass.core.pass_registry import applies_to

_MODULE = """
SCALE = {scale}


def helper(x):
    return x * SCALE{helper_extra}


def pass_a(gm):
    return helper(1) is None


def pass_b(gm):
    return {b_body}
"""


@pytest.fixture
def passes(tmp_path, monkeypatch):
    """Load a user module of passes as it is written now (``write`` rewrites it)."""
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "fxpass_test_identity_passes.py"

    def write(scale="2", helper_extra="", b_body="False"):
        path.write_text(textwrap.dedent(_MODULE.format(**locals())))
        sys.modules.pop("fxpass_test_identity_passes", None)
        import fxpass_test_identity_passes as mod

        return pass_uuid(fp.as_pass(mod.pass_a)), pass_uuid(fp.as_pass(mod.pass_b))

    yield write
    sys.modules.pop("fxpass_test_identity_passes", None)


def test_editing_one_pass_changes_only_its_uuid(passes):
    a, b = passes()
    assert passes() == (a, b)  # stable
    a2, b2 = passes(b_body="None")  # pass_b edited, in the same file as pass_a
    assert a2 == a and b2 != b
    a3, b3 = passes(helper_extra=" + 0")  # the helper pass_a calls
    assert a3 != a and b3 == b
    a4, b4 = passes(scale="3")  # a module constant pass_a's helper reads
    assert a4 != a and b4 == b


def test_options_ranges_and_requirements_are_part_of_the_uuid():
    def scale(gm, *, factor: float = 1.0):
        return False

    def uuid_of(p):
        return pass_uuid(fp.as_pass(p))

    one = fp.FunctionPass(scale, options={"factor": 1.0})
    two = fp.FunctionPass(scale, options={"factor": 2.0})
    assert uuid_of(one) != uuid_of(two)
    assert uuid_of(one) == uuid_of(fp.FunctionPass(scale, options={"factor": 1.0}))
    assert uuid_of(applies_to(one, tokens=(1, 8))) != uuid_of(applies_to(one, tokens=(1, 9)))

    class Needy(fp.Pass):
        needs = ("cse",)

        def call(self, gm):
            return False

    class Free(fp.Pass):
        name = "needy"

        def call(self, gm):
            return False

    assert "needs ('cse',)" not in pass_uuid(Needy())  # a digest, not the text
    assert pass_uuid(Needy()) != pass_uuid(Free())
    a = pipeline_uuid(fp.Pipeline([one, two]))
    assert a == pipeline_uuid(fp.Pipeline([one, two])) != pipeline_uuid(fp.Pipeline([two, one]))


def test_a_run_does_not_change_the_uuid_of_the_library_passes(llama_gm):
    pipe = fp.Pipeline.parse("remove_assert_ops,fuse_add_rmsnorm,cse,dce")
    before = pipeline_uuid(pipe)
    pipe.run(llama_gm)  # rule sets fill matcher caches as they run: state, not code
    assert pipeline_uuid(pipe) == before


def test_graph_hash_follows_structure_values_and_tensor_content():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    gm = torch.fx.symbolic_trace(model)
    same = torch.fx.symbolic_trace(copy.deepcopy(model))
    assert graph_hash(gm) == graph_hash(same)
    with torch.no_grad():
        same.get_submodule("0").weight.add_(1)
    assert graph_hash(gm) != graph_hash(same)  # a pass may read the weights
    x = torch.randn(2, 4)
    assert graph_hash(gm, [x]) != graph_hash(gm, [x + 1])  # real inputs: by content
    fake = torch._subclasses.FakeTensorMode().from_tensor(x)
    assert graph_hash(gm, [fake]) == graph_hash(gm, [fake.clone()])  # fake: by metadata
    assert graph_hash(gm, [fake]) != graph_hash(gm, [fake.t()])
