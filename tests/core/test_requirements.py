"""Requirements between passes: refused with the names and the column, or inserted."""

from __future__ import annotations

import pytest
import torch

import fxpass as fp
from fxpass.core.pass_registry import REGISTRY
from fxpass.core.requirements import RequirementError, with_required

aten = torch.ops.aten


def _graph() -> torch.fx.GraphModule:
    class Neg(torch.nn.Module):
        def forward(self, x):
            return -x

    return torch.export.export(Neg(), (torch.randn(2),)).graph_module


@pytest.fixture(scope="module")
def names():
    def clean(gm):
        return False

    def fuse(gm):
        return False

    class Tidy(fp.Pass):
        followed_by = ("_req_clean",)

        def call(self, gm):
            return False

    REGISTRY.register("_req_clean", replace=True)(clean)
    REGISTRY.register("_req_fuse", replace=True, needs=["_req_clean"], followed_by=["dce"])(fuse)
    REGISTRY.register("_req_tidy", replace=True)(Tidy)
    yield "_req_clean", "_req_fuse", "_req_tidy"
    for name in ("_req_clean", "_req_fuse", "_req_tidy"):
        REGISTRY.unregister(name)


@pytest.mark.parametrize(
    ("spec", "column", "what"),
    [
        ("_req_fuse,dce", 1, "needs '_req_clean' to run before it, but the pipeline does not"),
        ("dce, _req_fuse,_req_clean,dce", 6, "runs it only after it"),
        ("_req_clean,_req_fuse", 12, "must be followed by 'dce'"),
        ("_req_clean,fixpoint(_req_fuse),cse", 21, "must be followed by 'dce'"),
        ("_req_tidy", 1, "must be followed by '_req_clean'"),
    ],
)
def test_a_spec_breaking_a_requirement_is_refused_at_its_column(names, spec, column, what):
    with pytest.raises(RequirementError, match=what) as err:
        fp.Pipeline.parse(spec)
    assert err.value.column == column and err.value.spec == spec
    assert "insert_required=True" in str(err.value)


def test_requirements_met_anywhere_earlier_or_later(names):
    fp.Pipeline.parse("_req_clean,pipeline(fixpoint(_req_fuse)),cse,pipeline(dce)")
    fp.Pipeline.parse("pipeline(_req_clean),_req_fuse,dce")


def test_insert_required_puts_each_missing_pass_where_it_is_needed(names):
    pipe = fp.Pipeline.parse("cse,fixpoint(_req_fuse),_req_tidy", insert_required=True)
    assert str(pipe) == "cse,fixpoint(_req_clean,_req_fuse,dce),_req_tidy,_req_clean"
    result = pipe.run(_graph())
    assert [r.name for r in result.report.passes][:4] == [
        "cse",
        "fixpoint",
        "_req_clean",
        "_req_fuse",
    ]


def test_python_pipelines_are_checked_when_they_run(names):
    gm = _graph()
    pipe = fp.Pipeline(["_req_fuse", "dce"])
    with pytest.raises(RequirementError, match="'_req_fuse' needs '_req_clean'") as err:
        pipe.run(gm)
    assert err.value.column == 1 and err.value.spec == "_req_fuse,dce"
    with pytest.raises(RequirementError) as err:
        fp.Pipeline(["_req_clean", fp.Pipeline(["cse", "_req_fuse"])]).run(gm)
    assert err.value.spec == "_req_clean,pipeline(cse,_req_fuse)"
    assert err.value.column == err.value.spec.index("_req_fuse") + 1
    fixed = with_required(pipe)
    assert [p.name for p in fixed.passes] == ["_req_clean", "_req_fuse", "dce"]
    assert [p.name for p in pipe.passes] == ["_req_fuse", "dce"]  # the original is kept
    fixed.run(gm)
    fp.registry.create("_req_fuse")(gm)  # called on its own: what it needs may have run


def test_bad_declarations_are_refused_where_they_are_registered():
    with pytest.raises(TypeError, match="needs is a list of registered pass names"):
        REGISTRY.register("_req_bad", needs="cse")(lambda gm: None)
    assert "_req_bad" not in REGISTRY
