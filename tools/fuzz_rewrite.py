"""Fuzzers of fxpass's own rewriter and pipelines, on random ATen programs.

Three fuzzers, each a class with ``generate(rng)``, ``check(case)``, ``shrinks(case)`` and
``repro(case)`` (the protocol ``tools/fuzz.py`` drives):

``rewrite``
    A random program (``fuzz_programs``) exported to core ATen; a pattern cut out of its graph
    as a connected subprogram (or made up from the vocabulary), written as a function of ATen
    calls; a replacement computing the same values (the same ops, some in another exact
    spelling: ``a - b`` as ``a + -b``, operands of ``add``/``mul`` swapped, ``neg`` as
    ``* -1``, ``relu`` as ``clamp_min``). fxpass's rule (``traced_rule``) is compared with
    torch's ``SubgraphMatcher`` (the matched node sets, where torch's rules apply: no operand
    swapping, a pattern input binds a node no other input or inner node binds) and
    ``replace_pattern`` (the number of replacements, when the matches are disjoint); the
    rewritten graph must lint, recompile and run, compute the original program's outputs
    exactly, and every new node's ``meta['val']`` must equal (shape, dtype, stride, device)
    a fresh ``FakeTensorProp`` of the rewritten graph.
``pipeline``
    The default pipeline (or a random list of its passes) through ``fp.apply`` on a random
    exported program: the program still runs, its outputs equal the original's (within the
    dtype's tolerance: fusions may change rounding), the graph lints and every node's
    ``meta['val']`` equals a fresh propagation.
``rollback``
    A rule set whose replacement raises at its k-th rewrite (after building its nodes), run
    in a ``Pipeline``: it must raise ``PassFailedError`` and leave the graph as it was — the
    same node objects in the same order, the same arguments, the same metadata.

A check returns ``None`` when fxpass agrees, a :class:`Finding` (a class key and a detail)
when it does not, and raises :class:`Skip` when the case says nothing (the program does not
export, the reference itself fails).
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import inspect
import random
import sys
from pathlib import Path
from typing import Any

import torch
from torch import fx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fuzz_checks import (
    Finding,
    Skip,
    commented,
    error_finding,
    exported,
    graph_module,
    layout,
    make_rule,
    run_graph,
    same_outputs,
    script,
    torchlike,
    value_mismatch,
)
from fuzz_patterns import Cut, PNode, cut_from_graph, made_up_cut
from fuzz_programs import Op, Program, random_program

__all__ = [
    "FUZZERS",
    "Cut",
    "Finding",
    "PNode",
    "PipelineCase",
    "PipelineFuzzer",
    "RewriteCase",
    "RewriteFuzzer",
    "RollbackCase",
    "RollbackFuzzer",
    "Skip",
]


# ----- the rewrite fuzzer --------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class RewriteCase:
    program: Program
    cut: Cut
    variant: str  # "lifted" (ep.graph_module) or "unlifted" (ep.module())
    commute: bool
    seed: int
    fixpoint: bool = False  # the fixpoint driver, where the replacement cannot match again


class RewriteFuzzer:
    name = "rewrite"

    def __init__(self) -> None:
        self.notes: collections.Counter = collections.Counter()  # what the cases exercised

    def generate(self, rng: random.Random) -> RewriteCase:
        program = random_program(rng)
        variant = rng.choice(["lifted", "unlifted"])
        if rng.random() < 0.2:
            cut = made_up_cut(rng)
        else:
            ep = exported(program)
            cut = cut_from_graph(graph_module(ep, variant).graph, rng, rng.randint(1, 4))
            if cut is None:
                cut = made_up_cut(rng)
        return RewriteCase(
            program, cut, variant, rng.random() < 0.5, rng.randrange(1000), rng.random() < 0.4
        )

    def shrinks(self, case: RewriteCase) -> list[RewriteCase]:
        out = [dataclasses.replace(case, cut=c) for c in case.cut.shrinks()]
        out += [dataclasses.replace(case, program=p) for p in case.program.shrinks()]
        if case.commute:
            out.append(dataclasses.replace(case, commute=False))
        if case.fixpoint:
            out.append(dataclasses.replace(case, fixpoint=False))
        if case.variant == "unlifted":
            out.append(dataclasses.replace(case, variant="lifted"))
        return out

    def repro(self, case: RewriteCase, finding: Finding) -> str:
        explain = commented(
            case.program.source()
            + f"\n{case.variant} graph, commute={case.commute}\n\n"
            + case.cut.pattern_source()
            + case.cut.replacement_source()
        )
        return script(self, case, finding, explain)

    def check(self, case: RewriteCase) -> Finding | None:
        from torch.fx.passes.utils.fuser_utils import validate_partition
        from torch.fx.passes.utils.matcher_utils import SubgraphMatcher

        from fxpass.rewrite import rewrite

        ep = exported(case.program)
        inputs = case.program.example_inputs(case.seed)
        expected = ep.module()(*inputs)
        pattern_fn, replacement_fn = case.cut.functions()
        try:
            pattern_graph = fx.symbolic_trace(pattern_fn).graph
            ref = graph_module(copy.deepcopy(ep), case.variant)
            theirs = SubgraphMatcher(
                pattern_graph,
                match_output=False,
                match_placeholder=False,
                remove_overlapping_matches=False,
                ignore_literals=False,
            ).match(ref.graph)
            inner = [
                [gn for pn, gn in m.nodes_map.items() if pn.op not in ("placeholder", "output")]
                for m in theirs
            ]
            # torch also reports matches that a path leaving and re-entering makes cyclic
            # (fxpass refuses them, as torch's own validate_partition would): torch's fault
            acyclic = [nodes for nodes in inner if validate_partition(nodes)]
            torch_sets = {frozenset(n.name for n in nodes) for nodes in acyclic}
            torch_cyclic = len(acyclic) < len(inner)
            self.notes["torch cyclic matches left out"] += torch_cyclic
        except Exception:  # broad: torch's own failure is not a disagreement
            torch_sets, torch_cyclic = None, False
            self.notes["torch matcher failed"] += 1
        gm = graph_module(ep, case.variant)
        try:
            rule = make_rule(case.cut, case.commute)
        except Exception as e:  # broad: reported as a finding
            return error_finding("rule", e)
        try:
            ours = [m for n in gm.graph.nodes if (m := rule.match(n)) is not None]
        except Exception as e:  # broad: reported as a finding
            return error_finding("match", e)
        if torch_sets is not None:
            our_sets = {
                frozenset(n.name for n in m.nodes) for m in ours if torchlike(m, case.cut.params)
            }
            if not case.commute and our_sets != torch_sets:
                return Finding(
                    "rewrite:matches",
                    f"torch matches {sorted(map(sorted, torch_sets))}, "
                    f"fxpass {sorted(map(sorted, our_sets))}",
                )
            if case.commute and not torch_sets <= our_sets:
                return Finding(
                    "rewrite:missed-match",
                    f"torch matches {sorted(map(sorted, torch_sets - our_sets))}, fxpass does not",
                )
        before = set(gm.graph.nodes)
        try:
            result = rewrite(gm, [rule], once=not (case.fixpoint and case.cut.terminates()))
        except Exception as e:  # broad: reported as a finding
            return error_finding("rewrite", e)
        self.notes["cases with rewrites"] += bool(result.rewrites)
        self.notes["cases torch matched"] += bool(torch_sets)
        if (
            torch_sets is not None
            and not torch_cyclic
            and not case.commute
            and not (case.fixpoint and case.cut.terminates())
            and all(torchlike(m, case.cut.params) for m in ours)
            and _disjoint(torch_sets)
        ):
            try:
                replaced = len(
                    fx.subgraph_rewriter.replace_pattern(ref, pattern_fn, replacement_fn)
                )
            except Exception:  # broad: torch's own failure is not a disagreement
                replaced = None
            self.notes["replacement counts compared"] += 1
            if replaced is not None and replaced != result.rewrites:
                return Finding(
                    "rewrite:count",
                    f"torch replace_pattern replaced {replaced}, fxpass {result.rewrites}",
                )
        return self._check_graph(ep, gm, case.variant, inputs, expected, before, exact=True)

    @staticmethod
    def _check_graph(ep, gm, variant, inputs, expected, before, exact) -> Finding | None:
        try:
            gm.graph.lint()
        except Exception as e:  # broad: reported as a finding
            return error_finding("lint", e)
        try:
            gm.recompile()
            got = run_graph(ep, gm, variant, inputs)
        except Exception as e:  # broad: reported as a finding
            return error_finding("run", e)
        wrong = same_outputs(got, expected, exact)
        if wrong:
            return Finding("outputs", wrong)
        new = [n for n in gm.graph.nodes if n not in before]
        try:
            bad = value_mismatch(gm, new)
        except Exception as e:  # broad: reported as a finding
            return error_finding("fake-prop", e)
        return Finding("meta-val", bad) if bad else None


def _disjoint(sets: set[frozenset]) -> bool:
    seen: set = set()
    for s in sets:
        if s & seen:
            return False
        seen |= s
    return True


# ----- the pipeline fuzzer -------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class PipelineCase:
    program: Program
    spec: str
    seed: int


class PipelineFuzzer:
    name = "pipeline"

    def __init__(self) -> None:
        self.notes: collections.Counter = collections.Counter()

    def generate(self, rng: random.Random) -> PipelineCase:
        import fxpass as fp

        program = _normy(rng) if rng.random() < 0.25 else random_program(rng)
        r = rng.random()
        if r < 0.4:
            spec = "default"
        elif r < 0.55:
            spec = "remove_assert_ops,fuse_add_rmsnorm,fixpoint(cse,dce)"  # the README's
        else:
            names = list(fp.registry.pass_list("default").names())
            picked = [n for n in names if rng.random() < 0.5] or names[:1]
            spec = ",".join(picked)
        return PipelineCase(program, spec, rng.randrange(1000))

    def shrinks(self, case: PipelineCase) -> list[PipelineCase]:
        out = [dataclasses.replace(case, program=p) for p in case.program.shrinks()]
        names = case.spec.split(",")
        if len(names) > 1:
            out += [
                dataclasses.replace(case, spec=",".join(names[:i] + names[i + 1 :]))
                for i in range(len(names))
            ]
        return out

    def repro(self, case: PipelineCase, finding: Finding) -> str:
        explain = commented(case.program.source() + f"\npipeline: {case.spec}\n")
        return script(self, case, finding, explain)

    def check(self, case: PipelineCase) -> Finding | None:
        import fxpass as fp

        ep = exported(case.program)
        inputs = case.program.example_inputs(case.seed)
        expected = ep.module()(*inputs)
        before = set(ep.graph_module.graph.nodes)
        try:
            program = fp.apply(ep, case.spec).program
        except Exception as e:  # broad: reported as a finding
            return error_finding("pipeline", e)
        gm = program.graph_module
        self.notes["programs changed"] += bool(before - set(gm.graph.nodes))
        return RewriteFuzzer._check_graph(
            program, gm, "lifted", inputs, expected, set(), exact=False
        )


def _normy(rng: random.Random) -> Program:
    """An RMSNorm-like program (what the default pipeline's fusions look for), random in
    its details."""
    shape = rng.choice(((2, 8), (2, 4, 8)))
    dtype = rng.choice(("float32", "bfloat16"))
    ops = [
        Op("v2", "{0} + {1}", ("x0", "x1"))
        if rng.random() < 0.5
        else Op("v2", "{0} * 1.0", ("x0",))
    ]
    h = "v2"
    if dtype == "bfloat16" and rng.random() < 0.7:
        ops.append(Op("v3", "{0}.float()", (h,)))
        h = "v3"
    ops.append(Op("v4", "{0}.pow(2).mean(-1, keepdim=True)", (h,)))
    eps = rng.choice((1e-6, 1e-5))
    norm = rng.choice(
        (
            f"{{0}} * torch.rsqrt({{1}} + {eps!r})",
            f"{{0}} * torch.pow({{1}} + {eps!r}, -0.5)",
            f"{{0}} / torch.sqrt({{1}} + {eps!r})",
        )
    )
    ops.append(Op("v5", norm, (h, "v4")))
    out = "v5"
    if h != "v2":
        ops.append(Op("v6", "{0}.to(torch.bfloat16)", ("v5",)))
        out = "v6"
    ops.append(Op("v7", "{0} * {1}", ("x2", out)))
    outputs = ("v7", "v2") if rng.random() < 0.5 else ("v7",)
    inputs = ((shape, dtype), (shape, dtype), ((shape[-1],), dtype))
    return Program(inputs, tuple(ops), outputs).live()


# ----- the rollback fuzzer -------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class RollbackCase:
    program: Program
    cut: Cut
    fail_at: int
    seed: int


class Planted(RuntimeError):
    """The failure the rollback fuzzer plants in a replacement."""


def _snapshot(gm: fx.GraphModule) -> list[Any]:
    def value(v: Any) -> Any:
        if isinstance(v, fx.Node):
            return ("node", v.name)
        if isinstance(v, torch.Tensor):
            return ("tensor", layout(v))
        if isinstance(v, (list, tuple)):
            return tuple(value(x) for x in v)
        if isinstance(v, dict):
            return tuple((k, value(x)) for k, x in v.items())
        return repr(v)

    return [
        (id(n), n.name, n.op, str(n.target), value(n.args), value(n.kwargs), value(n.meta))
        for n in gm.graph.nodes
    ]


class RollbackFuzzer:
    name = "rollback"

    def __init__(self) -> None:
        self.notes: collections.Counter = collections.Counter()

    def generate(self, rng: random.Random) -> RollbackCase:
        program = random_program(rng)
        ep = exported(program)
        cut = cut_from_graph(ep.graph_module.graph, rng, rng.randint(1, 3)) or made_up_cut(rng)
        return RollbackCase(program, cut, rng.randint(1, 3), rng.randrange(1000))

    def shrinks(self, case: RollbackCase) -> list[RollbackCase]:
        out = [dataclasses.replace(case, cut=c) for c in case.cut.shrinks()]
        out += [dataclasses.replace(case, program=p) for p in case.program.shrinks()]
        if case.fail_at > 1:
            out.append(dataclasses.replace(case, fail_at=case.fail_at - 1))
        return out

    def repro(self, case: RollbackCase, finding: Finding) -> str:
        explain = commented(
            case.program.source()
            + f"\nthe replacement raises at rewrite {case.fail_at}\n\n"
            + case.cut.pattern_source()
            + case.cut.replacement_source()
        )
        return script(self, case, finding, explain)

    def check(self, case: RollbackCase) -> Finding | None:
        import fxpass as fp
        from fxpass.rewrite import rules

        ep = exported(case.program)
        gm = ep.graph_module
        _, replacement_fn = case.cut.functions()
        calls = [0]

        def failing(**bindings: Any) -> Any:
            out = replacement_fn(**bindings)
            calls[0] += 1
            if calls[0] == case.fail_at:
                raise Planted(f"planted failure at rewrite {case.fail_at}")
            return out

        failing.__signature__ = inspect.signature(replacement_fn)  # type: ignore[attr-defined]
        try:
            rule = make_rule(case.cut, True, replacement=failing, name="planted")
        except Exception as e:  # broad: reported as a finding
            return error_finding("rule", e)
        before = _snapshot(gm)
        code = gm.code
        try:
            fp.Pipeline([rules("planted", [rule])]).run(gm)
        except fp.PassFailedError:
            self.notes["runs rolled back"] += 1
            self.notes["rolled back after a rewrite"] += case.fail_at > 1
        except Exception as e:  # broad: reported as a finding
            return error_finding("rollback-raised", e)
        else:
            if calls[0] >= case.fail_at:
                return Finding("rollback:not-raised", "the planted failure did not fail the run")
            raise Skip("fewer matches than the planted failure's index")
        after = _snapshot(gm)
        if after != before:
            for i, (a, b) in enumerate(zip(before, after)):
                if a != b:
                    return Finding(
                        "rollback:graph-changed",
                        f"node {i}: before {a[1:]}\nafter {b[1:]}",
                    )
            return Finding(
                "rollback:graph-changed", f"{len(before)} nodes before, {len(after)} after"
            )
        if gm.code != code:
            return Finding("rollback:code-changed", "the module's code differs after rollback")
        return None


FUZZERS = {"rewrite": RewriteFuzzer, "pipeline": PipelineFuzzer, "rollback": RollbackFuzzer}
