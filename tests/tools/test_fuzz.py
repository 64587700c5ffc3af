"""fxpass fuzzing itself (tools/fuzz.py, tools/fuzz_rewrite.py): bounded property tests of
the rewriter, the default pipeline and rollback on random exported programs, the checks
shown to catch what they look for, and the driver's summary, shrinking and repro scripts."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import fuzz  # noqa: E402
import fuzz_checks as fc  # noqa: E402
import fuzz_patterns as fpat  # noqa: E402
import fuzz_rewrite as fr  # noqa: E402
from fuzz_programs import Op, Program, random_program  # noqa: E402

aten = torch.ops.aten

# Each case exports a program (about a second here): the bounds keep the file near a minute.
BOUNDED = settings(
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _agrees(fuzzer, seed: int) -> None:
    rng = random.Random(seed)
    try:
        case = fuzzer.generate(rng)
        finding = fuzzer.check(case)
    except fr.Skip:
        return
    assert finding is None, f"{finding.key}: {finding.detail}\n{case!r}"


@settings(BOUNDED, max_examples=12)
@given(st.integers(0, 2**32 - 1))
def test_rewriter_agrees_with_torch_and_itself(seed):
    """Matches equal torch's SubgraphMatcher's, counts its replace_pattern's; the rewritten
    graph lints, runs, computes the same outputs, and new nodes' meta['val'] are fresh."""
    _agrees(fr.RewriteFuzzer(), seed)


@settings(BOUNDED, max_examples=5)
@given(st.integers(0, 2**32 - 1))
def test_default_pipeline_keeps_programs_valid_and_equal(seed):
    _agrees(fr.PipelineFuzzer(), seed)


@settings(BOUNDED, max_examples=5)
@given(st.integers(0, 2**32 - 1))
def test_a_failing_rewrite_leaves_the_graph_as_it_was(seed):
    _agrees(fr.RollbackFuzzer(), seed)


def _neg_program() -> Program:
    return Program(
        (((2, 3), "float32"), ((2, 3), "float32")),
        (Op("v2", "{0} - {1}", ("x0", "x1")), Op("v3", "torch.neg({0})", ("v2",))),
        ("v3",),
    )


def test_random_programs_run_and_shrink():
    program = random_program(random.Random(7))
    program.module()(*program.example_inputs())
    for smaller in program.shrinks():
        assert len(smaller.ops) < len(program.ops) or len(smaller.outputs) < len(program.outputs)


def test_a_wrong_replacement_is_found(monkeypatch):
    """The output check has teeth: a 'respelling' that changes the value is reported."""
    ep = fc.exported(_neg_program())
    cut = fpat.cut_from_graph(ep.graph_module.graph, random.Random(0), 1)
    cut = fr.Cut(cut.params, cut.nodes, (True,) * len(cut.nodes))
    monkeypatch.setattr(
        fpat, "_respelled", lambda node: [fpat._call(node, target="aten.abs.default")]
    )
    case = fr.RewriteCase(_neg_program(), cut, "lifted", False, 0)
    finding = fr.RewriteFuzzer().check(case)
    assert finding is not None and finding.key == "outputs", finding


def test_a_stale_meta_val_is_found():
    ep = fc.exported(_neg_program())
    gm = ep.graph_module
    node = next(n for n in gm.graph.nodes if n.target is aten.neg.default)
    assert fc.value_mismatch(gm, [node]) is None
    node.meta["val"] = node.meta["val"].to(torch.bfloat16)
    assert "meta['val']" in fc.value_mismatch(gm, [node])


def test_a_change_left_behind_is_seen():
    gm = fc.exported(_neg_program()).graph_module
    before = fr._snapshot(gm)
    node = next(n for n in gm.graph.nodes if n.target is aten.neg.default)
    node.meta["stack_trace"] = "changed"
    assert fr._snapshot(gm) != before


def _run_tool(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def test_a_short_run_writes_its_summary(tmp_path):
    done = _run_tool(
        str(ROOT / "tools" / "fuzz.py"), "--minutes", "0.1", "--out", "tmp", cwd=tmp_path
    )
    assert done.returncode in (0, 1), done.stderr
    data = json.loads((tmp_path / "tmp" / "summary.json").read_text())
    for name in fuzz.OWN:
        assert data[name]["cases"] >= 1
        assert done.stdout.count(f"{name}: ") >= 1
    assert (tmp_path / "tmp" / "summary.txt").read_text().strip() == done.stdout.strip()
    assert done.returncode == (1 if any(d.get("disagreements") for d in data.values()) else 0)


PLANTED = """
import random
import sys

sys.path.insert(0, {tools!r})
from fuzz_programs import random_program
from fuzz_rewrite import Finding, RewriteCase, RewriteFuzzer, made_up_cut


class Planted(RewriteFuzzer):
    '''Disagrees with itself whenever a program negates (and exports nothing: fast).'''

    name = "planted"

    def generate(self, rng):
        while True:
            program = random_program(rng)
            if len(program.ops) > 3 and any("neg" in op.template for op in program.ops):
                return RewriteCase(program, made_up_cut(rng), "unlifted", True, 0)

    def check(self, case):
        negs = [op for op in case.program.ops if "neg" in op.template]
        return Finding("planted:neg", f"{{len(negs)}} negation(s)") if negs else None
"""


def test_a_planted_disagreement_gives_a_shrunk_repro_that_reproduces(tmp_path):
    (tmp_path / "planted_fuzzer.py").write_text(PLANTED.format(tools=str(ROOT / "tools")))
    done = _run_tool(
        str(ROOT / "tools" / "fuzz.py"),
        *("--minutes", "0", "--seed", "3", "--out", "out"),
        *("--fuzzer", "planted_fuzzer.py:Planted"),
        cwd=tmp_path,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    data = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert data["planted"]["disagreements"] == {"planted:neg": 1}
    repro = Path(data["planted"]["repros"]["planted:neg"])
    text = repro.read_text()
    case_line = next(line for line in text.splitlines() if line.startswith("CASE = "))
    assert case_line.count("Op(") == 1 and "neg" in case_line  # shrunk to the one negation
    assert "commute=False" in case_line and "'lifted'" in case_line
    again = _run_tool(str(repro), cwd=tmp_path)
    assert again.returncode == 1 and "planted:neg" in again.stdout, again.stdout + again.stderr


def test_shrinking_keeps_the_class():
    class Twice(fr.RewriteFuzzer):
        name = "twice"

        def check(self, case):
            n = sum("neg" in op.template for op in case.program.ops)
            return fr.Finding(f"negs:{min(n, 2)}", "") if n else None

    program = Program(
        (((3,), "float32"),),
        tuple(Op(f"v{i + 1}", "torch.neg({0})", (f"v{i}" if i else "x0",)) for i in range(4)),
        ("v4",),
    )
    case = fr.RewriteCase(program, fr.made_up_cut(random.Random(1)), "lifted", False, 0)
    small, finding, steps = fuzz.shrink(Twice(), case, fr.Finding("negs:2", ""), 30)
    assert finding.key == "negs:2" and len(small.program.ops) == 2 and steps >= 2


def test_unknown_and_missing_fuzzers_are_one_line_errors(tmp_path):
    done = _run_tool(
        str(ROOT / "tools" / "fuzz.py"), "--minutes", "0", "--fuzzer", "nope", cwd=tmp_path
    )
    assert done.returncode == 2 and "unknown fuzzer 'nope'" in done.stderr


@pytest.mark.parametrize("name", fuzz.OWN)
def test_cases_print_as_data_that_rebuilds_them(name):
    fuzzer = fuzz.make_fuzzer(name)
    case = fuzzer.generate(random.Random(5))
    env = {**vars(fr), "Op": Op, "Program": Program}
    assert eval(repr(case), env) == case
    assert textwrap.dedent(fuzzer.repro(case, fr.Finding("k", "d"))).startswith(
        '"""fxpass fuzz repro'
    )


def test_a_cyclic_torch_match_is_torchs_fault():
    """Found by a 20-minute run: torch's SubgraphMatcher reports a match that a path leaving
    it and coming back makes cyclic (the second add's other input is computed from the
    first); fxpass refuses it and says why, so the fuzzer must not count it as a miss."""
    from torch.fx.passes.utils.fuser_utils import validate_partition
    from torch.fx.passes.utils.matcher_utils import SubgraphMatcher

    from fxpass.rewrite import explain

    program = Program(
        (((3, 4), "float32"),),
        (
            Op("v2", "{0} + {1}", ("x0", "x0")),
            Op("v6", "torch.add({0}, torch.tensor(0.5))", ("v2",)),
            Op("v7", "{0} + {1}", ("v6", "v2")),
        ),
        ("v7",),
    )
    add = "aten.add.Tensor"
    cut = fpat.Cut(
        ("p3", "p4"),
        (
            fpat.PNode("n1", add, (("ref", "p3"), ("ref", "p3")), ()),
            fpat.PNode("n3", add, (("ref", "p4"), ("ref", "n1")), ()),
        ),
        (False, False),
        ("n1",),
    )
    case = fr.RewriteCase(program, cut, "lifted", False, 615)
    gm = fc.exported(program).graph_module
    pattern_fn, _ = cut.functions()
    theirs = SubgraphMatcher(
        torch.fx.symbolic_trace(pattern_fn).graph, remove_overlapping_matches=False
    ).match(gm.graph)
    inner = [gn for pn, gn in theirs[0].nodes_map.items() if pn.op not in ("placeholder", "output")]
    assert len(theirs) == 1 and not validate_partition(inner)
    root = next(n for n in gm.graph.nodes if n.name == "add_2")
    assert "would create a cycle" in str(explain(fc.make_rule(cut, False), root))
    assert fr.RewriteFuzzer().check(case) is None


def test_a_placeholder_bound_to_a_literal_is_compared_with_torch():
    """Found by a 2-minute run (seed 30): torch's SubgraphMatcher binds a pattern input to
    the literal of ``x0 + 2.0``, and so does fxpass's rule; the fuzzer once left fxpass's
    literal-bound match out of the comparison and reported torch's as a miss."""
    program = Program((((2, 3, 4), "bfloat16"),), (Op("v4", "{0} + 2.0", ("x0",)),), ("v4",))
    cut = fpat.Cut(
        ("p0", "p1"),
        (fpat.PNode("n0", "aten.add.Tensor", (("ref", "p0"), ("ref", "p1")), ()),),
        (False,),
    )
    case = fr.RewriteCase(program, cut, "lifted", commute=False, seed=404, fixpoint=False)
    fuzzer = fr.RewriteFuzzer()
    assert fuzzer.check(case) is None
    assert fuzzer.notes["replacement counts compared"] == 1  # torch replaced it too
    rule = fc.make_rule(cut, commute=False)
    graph = fc.graph_module(fc.exported(program), "lifted").graph
    (add,) = graph.find_nodes(op="call_function", target=aten.add.Tensor)
    m = rule.match(add)
    assert m is not None and m.bindings["p1"] == 2.0 and fc.torchlike(m, cut.params)
