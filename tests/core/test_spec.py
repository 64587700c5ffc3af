"""Textual pipelines: parse -> print round trips, and errors that point at the column."""

from __future__ import annotations

from typing import Annotated

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fxpass as fp
from fxpass.core.options import Range
from fxpass.core.pass_registry import Registry
from fxpass.core.pipeline import register_pipelines
from fxpass.core.run import MAX_NESTING, nesting
from fxpass.core.spec import parse_spec


@pytest.fixture(scope="module")
def reg() -> Registry:
    reg = Registry(entry_points=False)
    register_pipelines(reg)

    for name in ("remove_assert_ops", "cse", "dce", "canon"):
        reg.register(name)(lambda gm: None)

    @reg.register("fuse_add_rmsnorm")
    def fuse(gm, *, eps: float | None = None, dtypes: list[str] | None = None) -> bool:
        """Fuse."""
        return False

    @reg.register("picky")
    class Picky(fp.Pass):
        def __init__(self, *, limit: int = 1) -> None:
            if limit == 0:
                raise ValueError("zero")

    @reg.register("bounded")
    def bounded(gm, *, ratio: Annotated[float, Range(min=0.0, max=1.0)] = 0.5) -> bool:
        return False

    @reg.register("partition")
    def partition(gm, *, support: str = "", single: bool = False, max_size: int = 0) -> bool:
        """Partition."""
        return False

    return reg


ROUND_TRIPS = [
    "",
    "cse",
    "cse,dce",
    "remove_assert_ops,fuse_add_rmsnorm{eps=1e-6},fixpoint(cse,dce)",
    "fuse_add_rmsnorm{eps=1e-5}",
    "fuse_add_rmsnorm{eps=none}",
    "fuse_add_rmsnorm{eps=1e-6 dtypes=[bfloat16,float16]}",
    "fixpoint{max_iterations=3}(cse,dce)",
    "fixpoint{max_iterations=4 strict=true}(canon,fixpoint(cse,dce))",
    "pipeline(cse,dce),canon",
    'partition{support="aten.add.Tensor,aten.mul.Tensor" single=true}',
    "partition{max_size=0x10}",
    "default",
    f"{__name__}:module_level_pass,cse",
    "fixpoint(pipeline(fixpoint(cse)),dce)",
]


def module_level_pass(gm):
    return None


@pytest.mark.parametrize("spec", ROUND_TRIPS)
def test_parse_then_print_gives_back_the_spec(spec, reg):
    pipe = fp.Pipeline.parse(spec, reg)
    assert str(pipe) == spec
    assert str(fp.Pipeline.parse(str(pipe), reg)) == spec


def test_option_values_are_typed(reg):
    pipe = fp.Pipeline.parse(
        'fuse_add_rmsnorm{eps=1e-6 dtypes=[bfloat16,"float16"]},partition{single=true max_size=12}',
        reg,
    )
    fuse, part = pipe.passes
    assert fuse.options == {"eps": 1e-6, "dtypes": ["bfloat16", "float16"]}
    assert part.options == {"single": True, "max_size": 12}
    fix = fp.Pipeline.parse("fixpoint{max_iterations=3}(cse,dce)", reg).passes[0]
    assert isinstance(fix, fp.Fixpoint) and fix.max_iterations == 3
    assert [p.name for p in fix.passes] == ["cse", "dce"]


def test_spaces_and_commas_between_options_are_accepted(reg):
    pipe = fp.Pipeline.parse(" cse , fuse_add_rmsnorm{ eps = 1e-6, dtypes=[a , b] } ", reg)
    assert str(pipe) == "cse,fuse_add_rmsnorm{eps=1e-6 dtypes=[a , b]}"


MALFORMED = [
    ("cse,,dce", 5, "expected a pass name, got ','"),
    ("cse dce", 5, "expected ',' between passes, got 'd'"),
    ("cse,", 5, "expected a pass name, got the end of the spec"),
    ("fixpoint(cse,dce", 17, "missing ')' to close the '(' at column 9"),
    ("cse)", 4, "unexpected ')'"),
    ("fuse_add_rmsnorm{eps=}", 22, "expected a value for option 'eps', got '}'"),
    ("fuse_add_rmsnorm{eps 1e-6}", 22, "expected '=' after option 'eps'"),
    ("fuse_add_rmsnorm{eps=1e-6", 26, "missing '}' to close the '{' at column 17"),
    ("{eps=1}", 1, "expected a pass name, got '{'"),
    ('partition{support="aten.add}', 19, "unterminated string"),
    ("fixpoint()", 10, "needs at least one pass inside the parentheses"),
    ("9cse", 1, "expected a pass name, got '9'"),
    ("fuse_add_rmsnorm{dtypes=[a,b}", 29, "expected ',' or ']' in a list, got '}'"),
    ("fuse_add_rmsnorm{eps=1 eps=2}", 24, "option 'eps' is given twice"),
]


@pytest.mark.parametrize(("spec", "column", "message"), MALFORMED)
def test_malformed_specs_point_at_the_column(spec, column, message):
    with pytest.raises(fp.core.SpecError) as err:
        parse_spec(spec)
    assert err.value.column == column
    assert message in err.value.message
    lines = str(err.value).splitlines()
    assert lines[1].strip() == spec.strip()
    assert lines[2].index("^") - 2 == column - 1  # the caret sits under the column


SEMANTIC = [
    ("cse,fuse_add_rmsnrom", 5, fp.core.UnknownPassError, "did you mean 'fuse_add_rmsnorm'"),
    ("fuse_add_rmsnorm{eps=abc}", 22, fp.core.OptionError, "option 'eps' expects float | none"),
    ("fuse_add_rmsnorm{epz=1}", 18, fp.core.OptionError, "has no option 'epz'; did you mean 'eps'"),
    ("partition{single=maybe}", 18, fp.core.OptionError, "option 'single' expects bool"),
    ("partition{max_size=1.5}", 20, fp.core.OptionError, "option 'max_size' expects int"),
    ("cse(dce)", 4, fp.core.SpecError, "pass 'cse' does not take a nested pipeline"),
    ("fixpoint", 9, fp.core.SpecError, "takes a nested pipeline: write fixpoint(pass1,pass2)"),
    ("fixpoint{max_iterations=x}(cse)", 25, fp.core.OptionError, "expects int"),
    ("cse,no.such.module:fn", 5, fp.core.SpecError, "cannot import pass 'no.such.module:fn'"),
    (f"{__name__}:module_level_pass{{a=1}}", len(__name__) + 20, fp.core.SpecError,
     "takes no options"),
    ("fixpoint{max_iterations=0}(cse)", 25, fp.core.OptionError,
     "option 'max_iterations' expects int >= 1, got '0'"),
    ("fixpoint{max_iterations=[1]}(cse)", 25, fp.core.OptionError, "expects int >= 1, got a list"),
    ("picky{limit=0}", 1, fp.core.OptionError, "pass 'picky' refused its options: ValueError: zero"),
    ("bounded{ratio=1.5}", 15, fp.core.OptionError, "option 'ratio' expects float in [0.0, 1.0]"),
    (f"{__name__}:scaled{{factor=-1}}", len(__name__) + 16, fp.core.OptionError,
     "option 'factor' expects float >= 0.0, got '-1'"),
]  # fmt: skip


def scaled(gm, *, factor: Annotated[float, Range(min=0.0)] = 1.0) -> bool:
    """A pass named by where it is defined, with a bounded option."""
    return False


@pytest.mark.parametrize(("spec", "column", "error", "message"), SEMANTIC)
def test_bad_names_and_options_are_reported_at_the_column(spec, column, error, message, reg):
    with pytest.raises(error) as err:
        fp.Pipeline.parse(spec, reg)
    assert err.value.column == column
    assert message in str(err.value)


def test_the_global_registry_is_the_default(llama_gm):
    with pytest.raises(fp.core.UnknownPassError):
        fp.Pipeline.parse("definitely_not_a_pass")
    assert str(fp.Pipeline.parse("fixpoint(default)")) == "fixpoint(default)"


_TOKENS = ["cse", "dce", "fixpoint", "pipeline", "fuse_add_rmsnorm", "partition", "bounded",
           "picky", "max_iterations", "eps", "ratio", "limit", "strict", "=", ",", "{", "}",
           "(", ")", "[", "]", '"', "0", "-1", "1e-6", "1.5", "x", "true", "none", " ",
           f"{__name__}:scaled", "factor", "no.such:thing"]  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(_TOKENS), max_size=12))
def test_parse_raises_only_spec_errors(reg, tokens):
    """Whatever the text, parsing either builds a pipeline or raises a SpecError: never a
    bare ValueError, TypeError or KeyError."""
    try:
        fp.Pipeline.parse("".join(tokens), reg)
    except fp.core.SpecError as e:
        assert e.column >= 1


# ----- nesting: a documented limit, never Python's recursion limit ----------------------------
def _nested(open_: str, depth: int, inner: str = "cse") -> str:
    return open_ * depth + inner + ")" * depth


NESTED_FORMS = [
    "fixpoint(",
    "pipeline(",
    "fixpoint{max_iterations=2 strict=true}( ",
    " pipeline ( ",
]


@pytest.mark.parametrize("open_", NESTED_FORMS)
def test_a_spec_nests_up_to_the_limit_and_prints_back(open_, reg):
    spec = _nested(open_, MAX_NESTING, "cse,dce")
    pipe = fp.Pipeline.parse(spec, reg)
    assert nesting(pipe) == MAX_NESTING  # fixpoint(fixpoint(cse)) nests 2
    again = fp.Pipeline.parse(str(pipe), reg)
    assert str(again) == str(pipe)


@pytest.mark.parametrize("open_", NESTED_FORMS)
@pytest.mark.parametrize("depth", [MAX_NESTING + 1, 500, 20_000])
def test_a_deeper_spec_is_one_spec_error_at_the_first_paren_too_deep(open_, depth, reg):
    spec = _nested(open_, depth)
    with pytest.raises(fp.core.SpecError) as err:
        fp.Pipeline.parse(spec, reg)
    assert f"more than {MAX_NESTING} levels deep" in err.value.message
    assert err.value.column == len(open_) * MAX_NESTING + open_.index("(") + 1
    assert spec[err.value.column - 1] == "("
    assert len(str(err.value)) < 400  # the spec is quoted around the column, not whole


DEEP = fp.Pipeline(["cse"])
for _ in range(MAX_NESTING):
    DEEP = fp.Pipeline([DEEP])


def test_a_pipeline_object_named_in_a_spec_counts_its_own_nesting(reg):
    assert nesting(DEEP) == MAX_NESTING
    spec = f"cse,{__name__}:DEEP"
    with pytest.raises(fp.core.SpecError) as err:
        fp.Pipeline.parse(spec, reg)
    assert err.value.column == 5
    assert "more than 32 levels deep" in err.value.message


@pytest.mark.parametrize(
    ("spec", "column", "quoted"),
    [
        ("x" * 100_000, 1, "unknown pass 'xxx"),
        ("cse,fuse_add_rmsnorm{" + "k" * 100_000 + "=1}", 22, "has no option 'kkk"),
        ("fixpoint{max_iterations=" + "9x" * 50_000 + "}(cse)", 25, "expects int >= 1, got '9x9"),
        ("no.such." + "m" * 100_000 + ":fn", 1, "cannot import pass 'no.such.mmm"),
        ("fixpoint(" * 3 + "y" * 100_000 + ")))", 28, "unknown pass 'yyy"),
    ],
)
def test_a_huge_input_is_quoted_short_in_the_error(spec, column, quoted, reg):
    with pytest.raises(fp.core.SpecError) as err:
        fp.Pipeline.parse(spec, reg)
    assert err.value.column == column
    assert err.value.spec == spec  # kept whole for callers; the message quotes it short
    assert quoted in err.value.message
    assert len(err.value.message) < 400
    assert "characters)" in err.value.message
    lines = str(err.value).splitlines()
    assert len(lines) == 3 and max(map(len, lines)) < 500
    shown, caret = lines[1][2:], lines[2].index("^") - 2
    assert shown[caret] == spec[column - 1]  # the caret still sits under the column
