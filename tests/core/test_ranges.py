"""Shape-range passes: the spec syntax (parse, print back, column errors), the Python
spellings, and a pipeline that skips a pass outside its range and says why."""

from __future__ import annotations

import pytest
import torch

import fxpass as fp
from fxpass.core.pass_registry import REGISTRY, applies_to
from fxpass.core.ranges import (
    SizeRange,
    compile_range,
    current_range,
    declared_ranges,
    format_ranges,
    parse_ranges,
    range_skip,
)

aten = torch.ops.aten


def neg_to_mul(gm: torch.fx.GraphModule) -> bool:
    """neg(x) -> mul(x, -1): a real rewrite whose presence the tests can see."""
    changed = False
    for node in list(gm.graph.find_nodes(op="call_function", target=aten.neg.default)):
        with gm.graph.inserting_before(node):
            new = gm.graph.call_function(aten.mul.Tensor, (node.args[0], -1.0))
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
        changed = True
    return changed


def _negating_graph() -> torch.fx.GraphModule:
    class Neg(torch.nn.Module):
        def forward(self, x):
            return -x + 1

    return torch.export.export(Neg(), (torch.randn(4),)).graph_module


@pytest.fixture
def registered():
    REGISTRY.register("_ranges_test_neg", replace=True)(neg_to_mul)
    REGISTRY.register("_ranges_test_small", replace=True, applies_to={"tokens": (1, 512)})(
        lambda gm: neg_to_mul(gm)
    )
    yield "_ranges_test_neg", "_ranges_test_small"
    REGISTRY.unregister("_ranges_test_neg")
    REGISTRY.unregister("_ranges_test_small")


@pytest.mark.parametrize(
    ("text", "ranges"),
    [
        ("tokens:1..512", {"tokens": SizeRange(1, 512)}),
        ("tokens:513..", {"tokens": SizeRange(513, None)}),
        ("tokens:8", {"tokens": SizeRange(8, 8)}),
        ("[tokens:1..8, batch:2..4]", {"tokens": SizeRange(1, 8), "batch": SizeRange(2, 4)}),
    ],
)
def test_range_text_round_trips(text, ranges):
    assert parse_ranges(text) == ranges
    assert parse_ranges(format_ranges(ranges)) == ranges


def test_spec_option_parses_prints_back_and_limits_the_entry(registered):
    neg, _ = registered
    spec = (
        f"{neg}{{applies_to=tokens:1..512}},fixpoint{{applies_to=[tokens:1..8,batch:2..]}}({neg})"
    )
    pipe = fp.Pipeline.parse(spec)
    assert str(pipe) == spec
    first, loop = pipe.passes
    assert declared_ranges(first) == {"tokens": SizeRange(1, 512)}
    assert declared_ranges(loop) == {"tokens": SizeRange(1, 8), "batch": SizeRange(2, None)}
    assert declared_ranges(fp.registry.create(neg)) is None  # the registered pass is untouched


@pytest.mark.parametrize(
    ("spec", "at", "message"),
    [  # ``at``: the text the error points at (its last occurrence)
        ("p{applies_to=tokens:1..x}", "x}", "is not a size range"),
        ("p{applies_to=tokens:9..3}", "3}", "ends at 3, before its start 9"),
        ("p{applies_to=tokens}", "}", "is not a size range"),
        ("p{applies_to=[tokens:1..2, tokens:3..4]}", "tokens:3", "given twice"),
        ("p{applies_to=tokens:}", "}", "is not a size range"),
    ],
)
def test_bad_ranges_point_at_their_column(registered, spec, at, message):
    spec = spec.replace("p{", registered[0] + "{")
    with pytest.raises(fp.core.SpecError, match=message) as err:
        fp.Pipeline.parse(spec)
    assert err.value.column == spec.rindex(at) + 1, str(err.value)


def test_registered_range_and_the_python_spelling(registered):
    _, small = registered
    assert declared_ranges(fp.registry.create(small)) == {"tokens": SizeRange(1, 512)}
    limited = applies_to(neg_to_mul, tokens=(1, 8))
    assert limited.spec.endswith("{applies_to=tokens:1..8}")
    again = applies_to(limited, {"tokens": (9, None)})  # replaces, does not repeat
    assert again.spec.count("applies_to") == 1 and again.spec.endswith("tokens:9..}")
    with pytest.raises(ValueError, match="at least one size range"):
        applies_to(neg_to_mul)
    with pytest.raises(ValueError, match="ends at a whole number"):
        applies_to(neg_to_mul, tokens=(8, 1))


def test_a_pass_runs_only_inside_its_range(registered):
    neg, small = registered
    pipe = fp.Pipeline.parse(f"{small},{neg}{{applies_to=tokens:513..}}")

    def run(**sizes):
        gm = _negating_graph()
        with compile_range(**sizes) if sizes else _nothing():
            report = pipe.run(gm).report
        return [(r.name, r.status) for r in report.passes], report

    statuses, report = run()
    assert statuses == [(small, "skipped"), (neg, "skipped")]
    assert "no range for 'tokens'" in report.find(small).notes[0]
    assert "skipped: " in str(report)  # the table says why
    statuses, report = run(tokens=(1, 256))
    assert statuses == [(small, "ok"), (neg, "skipped")]
    assert report.find(small).modified
    assert "not to this compile's tokens:1..256" in report.find(neg).notes[0]
    statuses, _ = run(tokens=(256, 1024))  # only partly inside: neither applies
    assert statuses == [(small, "skipped"), (neg, "skipped")]
    statuses, _ = run(tokens=600)
    assert statuses == [(small, "skipped"), (neg, "ok")]


def test_compile_ranges_nest_and_restore():
    assert current_range() is None
    with compile_range(tokens=(1, 8)):
        with compile_range(batch=2):
            assert current_range() == {"tokens": SizeRange(1, 8), "batch": SizeRange(2, 2)}
            assert range_skip(applies_to(neg_to_mul, batch=(1, 4))) is None
        assert current_range() == {"tokens": SizeRange(1, 8)}
    assert current_range() is None


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False
