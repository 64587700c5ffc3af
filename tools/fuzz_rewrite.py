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
import traceback
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from torch import fx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fuzz_programs import Op, Program, export_program, random_program

aten = torch.ops.aten

__all__ = [
    "Cut",
    "Finding",
    "PNode",
    "PipelineFuzzer",
    "RewriteCase",
    "RewriteFuzzer",
    "RollbackFuzzer",
    "Skip",
]


class Skip(Exception):
    """The case says nothing about fxpass (the program does not export, torch fails)."""


@dataclasses.dataclass(frozen=True)
class Finding:
    """A disagreement: ``key`` names its class (what the driver deduplicates by)."""

    key: str
    detail: str


# ----- patterns as data ----------------------------------------------------------------------
# An argument is ("ref", name), ("lit", source) or ("list", (args...)).
@dataclasses.dataclass(frozen=True)
class PNode:
    name: str
    target: str  # "aten.add.Tensor"
    args: tuple
    kwargs: tuple  # ((key, arg), ...)


@dataclasses.dataclass(frozen=True)
class Cut:
    """A pattern function's parameters and nodes (the last is the root), for each node
    whether the replacement spells it another way, and the inner nodes it also returns
    (the rule's extra outputs: values used outside the match)."""

    params: tuple[str, ...]
    nodes: tuple[PNode, ...]
    spell: tuple[bool, ...]
    extra: tuple[str, ...] = ()

    @property
    def returned(self) -> str:
        return ", ".join((self.root, *self.extra)) if self.extra else self.root

    def pattern_source(self) -> str:
        return _function("pattern", self.params, [_call(n) for n in self.nodes], self.returned)

    def replacement_source(self) -> str:
        lines: list[str] = []
        for node, alt in zip(self.nodes, self.spell):
            lines.extend(_respelled(node) if alt else [_call(node)])
        return _function("replacement", self.params, lines, self.returned)

    @property
    def root(self) -> str:
        return self.nodes[-1].name

    def terminates(self) -> bool:
        """Whether rewriting to a fixpoint must stop: the replacement calls no op of the
        pattern's root, so it cannot be the root of a new match."""
        target = self.nodes[-1].target
        return f"= {target}(" not in self.replacement_source()

    def functions(self) -> tuple[Any, Any]:
        env: dict[str, Any] = {"torch": torch, "aten": aten}
        exec(self.pattern_source() + self.replacement_source(), env)
        return env["pattern"], env["replacement"]

    def shrinks(self) -> list[Cut]:
        """Smaller patterns: fewer outputs; a node other than the root made a parameter; no
        respelling."""
        out = []
        if self.extra:
            out.append(dataclasses.replace(self, extra=()).used())
        if any(self.spell):
            out.append(dataclasses.replace(self, spell=(False,) * len(self.nodes)))
        for i in range(len(self.nodes) - 1):
            gone = self.nodes[i].name
            fresh = f"p{1 + max((int(p[1:]) for p in self.params), default=-1)}"
            nodes = tuple(_rename(n, gone, fresh) for n in self.nodes[i + 1 :])
            cut = Cut(
                (*self.params, fresh),
                self.nodes[:i] + nodes,
                self.spell[:i] + self.spell[i + 1 :],
                tuple(e for e in self.extra if e != gone),
            )
            out.append(cut.used())
        return out

    def used(self) -> Cut:
        """Without nodes and parameters the returned values do not need."""
        need = {self.root, *self.extra}
        keep = []
        for node, alt in reversed(list(zip(self.nodes, self.spell))):
            if node.name in need:
                keep.append((node, alt))
                need.update(_refs(node))
        keep.reverse()
        params = tuple(p for p in self.params if p in need)
        return Cut(params, tuple(n for n, _ in keep), tuple(a for _, a in keep), self.extra)


def _refs(node: PNode) -> set[str]:
    out: set[str] = set()

    def visit(a: Any) -> None:
        if a[0] == "ref":
            out.add(a[1])
        elif a[0] == "list":
            for x in a[1]:
                visit(x)

    for a in node.args:
        visit(a)
    for _, a in node.kwargs:
        visit(a)
    return out


def _rename(node: PNode, old: str, new: str) -> PNode:
    def sub(a: Any) -> Any:
        if a[0] == "ref":
            return ("ref", new) if a[1] == old else a
        if a[0] == "list":
            return ("list", tuple(sub(x) for x in a[1]))
        return a

    return dataclasses.replace(
        node,
        args=tuple(sub(a) for a in node.args),
        kwargs=tuple((k, sub(a)) for k, a in node.kwargs),
    )


def _arg_source(a: Any) -> str:
    if a[0] == "list":
        return "[" + ", ".join(_arg_source(x) for x in a[1]) + "]"
    return a[1]


def _call(node: PNode, name: str | None = None, target: str | None = None, args=None) -> str:
    parts = [_arg_source(a) for a in (node.args if args is None else args)]
    parts += [f"{k}={_arg_source(a)}" for k, a in node.kwargs]
    return f"{name or node.name} = {target or node.target}({', '.join(parts)})"


def _respelled(node: PNode) -> list[str]:
    """``node``'s value computed another way, bit for bit."""
    args, t = node.args, node.target
    refs = len(args) == 2 and all(a[0] == "ref" for a in args) and not node.kwargs
    if t in ("aten.add.Tensor", "aten.mul.Tensor") and refs:
        return [_call(node, args=(args[1], args[0]))]
    if t == "aten.sub.Tensor" and len(args) == 2 and not node.kwargs:
        if args[1][0] == "ref":
            neg = f"{node.name}_neg"
            return [
                f"{neg} = aten.neg.default({args[1][1]})",
                _call(node, target="aten.add.Tensor", args=(args[0], ("ref", neg))),
            ]
        return [_call(node, target="aten.add.Tensor", args=(args[0], ("lit", f"-({args[1][1]})")))]
    if t == "aten.neg.default" and not node.kwargs:
        return [_call(node, target="aten.mul.Tensor", args=(args[0], ("lit", "-1.0")))]
    if t == "aten.relu.default" and not node.kwargs:
        return [_call(node, target="aten.clamp_min.default", args=(args[0], ("lit", "0.0")))]
    return [_call(node)]


def _function(name: str, params: tuple[str, ...], lines: list[str], root: str) -> str:
    body = "".join(f"    {line}\n" for line in lines)
    return f"def {name}({', '.join(params)}):\n{body}    return {root}\n"


def _literal(v: Any) -> str:
    if isinstance(v, torch.dtype):
        return f"torch.{str(v).split('.')[-1]}"
    if isinstance(v, (torch.layout, torch.memory_format)):
        return str(v)
    if isinstance(v, torch.device):
        return f"torch.device({str(v)!r})"
    if isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))):
        return f"float({str(v)!r})"
    if isinstance(v, (list, tuple)):
        inner = ", ".join(_literal(x) for x in v)
        return f"[{inner}]" if isinstance(v, list) else f"({inner}{',' if len(v) == 1 else ''})"
    return repr(v)


def _target_name(target: Any) -> str | None:
    if not isinstance(target, torch._ops.OpOverload):
        return None
    ns, rest = str(target).split(".", 1)
    return f"{ns}.{rest}" if ns == "aten" else None


def _cuttable(n: fx.Node) -> bool:
    return (
        n.op == "call_function"
        and _target_name(n.target) is not None
        and n.target is not aten._assert_tensor_metadata.default
    )


def cut_from_graph(graph: fx.Graph, rng: random.Random, size: int) -> Cut | None:
    """A connected subprogram of ``graph`` rooted at a random node, as a :class:`Cut`."""
    candidates = [n for n in graph.nodes if _cuttable(n)]
    if not candidates:
        return None
    # roots late in the graph more often: they have ancestors to grow into
    chosen = [candidates[max(rng.randrange(len(candidates)), rng.randrange(len(candidates)))]]
    contained_only = rng.random() < 0.6  # often a cut torch's containment rule accepts
    while len(chosen) < size:
        inside = set(chosen)
        frontier = [
            i for n in chosen for i in n.all_input_nodes if i not in inside and _cuttable(i)
        ]
        contained = [i for i in frontier if all(u in inside for u in i.users)]
        if contained_only and contained:
            frontier = contained
        if not frontier:
            break
        chosen.append(rng.choice(frontier))
    order = {n: i for i, n in enumerate(graph.nodes)}
    chosen.sort(key=order.__getitem__)
    names = {n: f"n{i}" for i, n in enumerate(chosen)}
    params: dict[fx.Node, str] = {}

    def arg(a: Any) -> Any:
        if isinstance(a, fx.Node):
            if a in names:
                return ("ref", names[a])
            params.setdefault(a, f"p{len(params)}")
            return ("ref", params[a])
        if isinstance(a, (list, tuple)) and any(isinstance(x, fx.Node) for x in a):
            return ("list", tuple(arg(x) for x in a))
        return ("lit", _literal(a))

    nodes = tuple(
        PNode(
            names[n],
            _target_name(n.target),
            tuple(arg(a) for a in n.args),
            tuple((k, arg(v)) for k, v in n.kwargs.items()),
        )
        for n in chosen
    )
    spell = tuple(rng.random() < 0.5 for _ in nodes)
    escaping = [
        names[n] for n in chosen[:-1] if any(u not in names for u in n.users) and rng.random() < 0.7
    ]
    return Cut(tuple(params.values()), nodes, spell, tuple(escaping))


_UNARY = ("aten.neg.default", "aten.relu.default", "aten.exp.default", "aten.rsqrt.default")
_BINARY = ("aten.add.Tensor", "aten.mul.Tensor", "aten.sub.Tensor", "aten.div.Tensor")


def made_up_cut(rng: random.Random) -> Cut:
    """A pattern from the vocabulary, not cut from any graph (it may match nowhere)."""
    params = ["p0"]
    nodes: list[PNode] = []
    current = ("ref", "p0")
    for i in range(rng.randint(1, 3)):
        kind = rng.random()
        if kind < 0.35:
            node = PNode(f"n{i}", rng.choice(_UNARY), (current,), ())
        elif kind < 0.8:
            if rng.random() < 0.5:
                other = ("ref", rng.choice([*params, f"p{len(params)}"]))
                if other[1] not in params:
                    params.append(other[1])
            else:
                other = ("lit", repr(rng.choice((2.0, 1e-6, 1, 0.5))))
            node = PNode(f"n{i}", rng.choice(_BINARY), (current, other), ())
        elif kind < 0.9:
            node = PNode(f"n{i}", "aten.mean.dim", (current, ("lit", "[-1]"), ("lit", "True")), ())
        else:
            node = PNode(f"n{i}", "aten.pow.Tensor_Scalar", (current, ("lit", "2")), ())
        nodes.append(node)
        current = ("ref", node.name)
    return Cut(tuple(params), tuple(nodes), tuple(rng.random() < 0.5 for _ in nodes))


# ----- checks --------------------------------------------------------------------------------
_EXPORTED: collections.OrderedDict = collections.OrderedDict()


def _export(program: Program) -> torch.export.ExportedProgram:
    """A fresh copy of the program's export (exports are remembered: exporting costs most
    of a case, and a case and its shrinking export the same program several times)."""
    if program not in _EXPORTED:
        try:
            _EXPORTED[program] = export_program(program)
        except Exception as e:  # broad: a program torch cannot export says nothing about fxpass
            raise Skip(f"export: {type(e).__name__}") from None
        while len(_EXPORTED) > 32:
            _EXPORTED.popitem(last=False)
    return copy.deepcopy(_EXPORTED[program])


def _graph_module(ep: torch.export.ExportedProgram, variant: str) -> fx.GraphModule:
    return ep.graph_module if variant == "lifted" else ep.module()


def _run(ep: torch.export.ExportedProgram, gm: fx.GraphModule, variant: str, inputs) -> Any:
    if variant == "lifted":
        return ep.module()(*inputs)
    return gm(*inputs)


def _same_outputs(got: Any, want: Any, exact: bool) -> str | None:
    try:
        if exact:
            torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
        else:
            torch.testing.assert_close(got, want, equal_nan=True)
    except AssertionError as e:
        return str(e).strip().splitlines()[0]
    return None


def _layout(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return (tuple(v.shape), v.dtype, tuple(v.stride()), v.device.type)
    if isinstance(v, (list, tuple)):
        return tuple(_layout(x) for x in v)
    return v if isinstance(v, (int, float, bool, type(None))) else type(v).__name__


def _fresh_values(gm: fx.GraphModule) -> dict[str, Any]:
    """Every node's value layout from a fresh ``FakeTensorProp`` (metadata left as it was)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    saved = {n: n.meta.get("val") for n in gm.graph.nodes}
    fakes = []
    with mode:
        for n in gm.graph.nodes:
            if n.op == "placeholder":
                v = n.meta["val"]
                fakes.append(
                    torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device=v.device)
                )
    try:
        FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*fakes)
        return {n.name: _layout(n.meta.get("val")) for n in gm.graph.nodes}
    finally:
        for n, v in saved.items():
            if v is None:
                n.meta.pop("val", None)
            else:
                n.meta["val"] = v


def _value_mismatch(gm: fx.GraphModule, nodes: Iterable[fx.Node]) -> str | None:
    nodes = [n for n in nodes if n.op not in ("placeholder", "output")]
    if not nodes:
        return None
    fresh = _fresh_values(gm)
    for n in nodes:
        if n.meta.get("val") is None:
            if fresh[n.name] is None:  # an op that returns nothing (export's asserts)
                continue
            return f"{n.name} ({n.target}) has no meta['val']"
        have = _layout(n.meta["val"])
        if have != fresh[n.name]:
            return f"{n.name} ({n.target}): meta['val'] {have} != propagated {fresh[n.name]}"
    return None


def _error(stage: str, e: BaseException) -> Finding:
    tb = "".join(traceback.format_exception(type(e), e, e.__traceback__)[-6:])
    first = (str(e).strip().splitlines() or [""])[0][:300]
    return Finding(f"{stage}:{type(e).__name__}", f"{type(e).__name__}: {first}\n{tb}")


def _no_commute(pattern: Any) -> None:
    from fxpass.rewrite import Pattern

    seen: set[int] = set()
    stack = [pattern] if not isinstance(pattern, tuple) else list(pattern)
    while stack:
        p = stack.pop()
        if id(p) in seen or not isinstance(p, Pattern):
            continue
        seen.add(id(p))
        if hasattr(p, "commutative"):
            p.commutative = False
        stack.extend(c for c in p.children() if isinstance(c, Pattern))


def _rule(cut: Cut, commute: bool, replacement: Any = None, **options: Any):
    from fxpass.rewrite import traced_rule

    pattern_fn, replacement_fn = cut.functions()
    examples = tuple(torch.empty(1) for _ in cut.params)
    if replacement is None:
        rule = traced_rule(pattern_fn, replacement_fn, examples, ir="fx", drop_users=(), **options)
    else:
        rule = traced_rule(
            pattern_fn, replacement, examples, ir="fx", trace_replacement=False, **options
        )
    if not commute:
        _no_commute(rule.pattern)
    return rule


def _torchlike(m: Any, params: tuple[str, ...]) -> bool:
    """Whether torch's matcher could report ``m``: each input (``params``) binds its own
    node, one that the match does not also cover."""
    bound = [m.bindings[p] for p in params if p in m.bindings]
    if not all(isinstance(v, fx.Node) for v in bound):
        return False
    inner = set(m.nodes)
    return len(set(bound)) == len(bound) and not (set(bound) & inner)


_HEADER = '''"""fxpass fuzz repro ({fuzzer}): {key}

{detail}
"""

import sys
from pathlib import Path

for root in [Path(__file__).resolve().parent, Path.cwd(), Path({repo!r})]:
    if (root / "tools" / "fuzz_rewrite.py").exists():
        sys.path.insert(0, str(root / "tools"))
        sys.path.insert(0, str(root / "src"))
        break
sys.path.insert(0, {where!r})

import torch  # noqa: E402
from fuzz_programs import Op, Program  # noqa: E402,F401
from fuzz_rewrite import Cut, PNode, PipelineCase, RewriteCase, RollbackCase  # noqa: E402,F401
from {module} import {cls}  # noqa: E402

'''

_FOOTER = """
finding = {cls}().check(CASE)
print(finding.key if finding else "no disagreement", finding.detail if finding else "", sep="\\n")
sys.exit(1 if finding else 0)
"""

REPO = str(Path(__file__).resolve().parents[1])


def _script(fuzzer: Any, case: Any, finding: Finding, explain: str) -> str:
    """A script that rebuilds ``case``, checks it with ``fuzzer``'s class and exits 1 while
    it still disagrees."""
    file = Path(inspect.getfile(type(fuzzer))).resolve()
    detail = finding.detail.replace('"""', "'''").replace("\\", "\\\\")
    header = _HEADER.format(
        fuzzer=fuzzer.name,
        key=finding.key,
        detail=detail,
        repo=REPO,
        where=str(file.parent),
        module=file.stem,
        cls=type(fuzzer).__qualname__,
    )
    return header + explain + f"\nCASE = {case!r}\n" + _FOOTER.format(cls=type(fuzzer).__qualname__)


def _commented(text: str) -> str:
    return "".join(f"# {line}\n" for line in text.splitlines())


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
            ep = _export(program)
            cut = cut_from_graph(_graph_module(ep, variant).graph, rng, rng.randint(1, 4))
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
        explain = _commented(
            case.program.source()
            + f"\n{case.variant} graph, commute={case.commute}\n\n"
            + case.cut.pattern_source()
            + case.cut.replacement_source()
        )
        return _script(self, case, finding, explain)

    def check(self, case: RewriteCase) -> Finding | None:
        from torch.fx.passes.utils.matcher_utils import SubgraphMatcher

        from fxpass.rewrite import rewrite

        ep = _export(case.program)
        inputs = case.program.example_inputs(case.seed)
        expected = ep.module()(*inputs)
        pattern_fn, replacement_fn = case.cut.functions()
        try:
            pattern_graph = fx.symbolic_trace(pattern_fn).graph
            ref = _graph_module(copy.deepcopy(ep), case.variant)
            theirs = SubgraphMatcher(
                pattern_graph,
                match_output=False,
                match_placeholder=False,
                remove_overlapping_matches=False,
                ignore_literals=False,
            ).match(ref.graph)
            torch_sets = {
                frozenset(
                    gn.name
                    for pn, gn in m.nodes_map.items()
                    if pn.op not in ("placeholder", "output")
                )
                for m in theirs
            }
        except Exception:  # broad: torch's own failure is not a disagreement
            torch_sets = None
            self.notes["torch matcher failed"] += 1
        gm = _graph_module(ep, case.variant)
        try:
            rule = _rule(case.cut, case.commute)
        except Exception as e:  # broad: reported as a finding
            return _error("rule", e)
        try:
            ours = [m for n in gm.graph.nodes if (m := rule.match(n)) is not None]
        except Exception as e:  # broad: reported as a finding
            return _error("match", e)
        if torch_sets is not None:
            our_sets = {
                frozenset(n.name for n in m.nodes) for m in ours if _torchlike(m, case.cut.params)
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
            return _error("rewrite", e)
        self.notes["cases with rewrites"] += bool(result.rewrites)
        self.notes["cases torch matched"] += bool(torch_sets)
        if (
            torch_sets is not None
            and not case.commute
            and not (case.fixpoint and case.cut.terminates())
            and all(_torchlike(m, case.cut.params) for m in ours)
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
            return _error("lint", e)
        try:
            gm.recompile()
            got = _run(ep, gm, variant, inputs)
        except Exception as e:  # broad: reported as a finding
            return _error("run", e)
        wrong = _same_outputs(got, expected, exact)
        if wrong:
            return Finding("outputs", wrong)
        new = [n for n in gm.graph.nodes if n not in before]
        try:
            bad = _value_mismatch(gm, new)
        except Exception as e:  # broad: reported as a finding
            return _error("fake-prop", e)
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
        explain = _commented(case.program.source() + f"\npipeline: {case.spec}\n")
        return _script(self, case, finding, explain)

    def check(self, case: PipelineCase) -> Finding | None:
        import fxpass as fp

        ep = _export(case.program)
        inputs = case.program.example_inputs(case.seed)
        expected = ep.module()(*inputs)
        before = set(ep.graph_module.graph.nodes)
        try:
            program = fp.apply(ep, case.spec).program
        except Exception as e:  # broad: reported as a finding
            return _error("pipeline", e)
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
            return ("tensor", _layout(v))
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
        ep = _export(program)
        cut = cut_from_graph(ep.graph_module.graph, rng, rng.randint(1, 3)) or made_up_cut(rng)
        return RollbackCase(program, cut, rng.randint(1, 3), rng.randrange(1000))

    def shrinks(self, case: RollbackCase) -> list[RollbackCase]:
        out = [dataclasses.replace(case, cut=c) for c in case.cut.shrinks()]
        out += [dataclasses.replace(case, program=p) for p in case.program.shrinks()]
        if case.fail_at > 1:
            out.append(dataclasses.replace(case, fail_at=case.fail_at - 1))
        return out

    def repro(self, case: RollbackCase, finding: Finding) -> str:
        explain = _commented(
            case.program.source()
            + f"\nthe replacement raises at rewrite {case.fail_at}\n\n"
            + case.cut.pattern_source()
            + case.cut.replacement_source()
        )
        return _script(self, case, finding, explain)

    def check(self, case: RollbackCase) -> Finding | None:
        import fxpass as fp
        from fxpass.rewrite import rules

        ep = _export(case.program)
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
            rule = _rule(case.cut, True, replacement=failing, name="planted")
        except Exception as e:  # broad: reported as a finding
            return _error("rule", e)
        before = _snapshot(gm)
        code = gm.code
        try:
            fp.Pipeline([rules("planted", [rule])]).run(gm)
        except fp.PassFailedError:
            self.notes["runs rolled back"] += 1
            self.notes["rolled back after a rewrite"] += case.fail_at > 1
        except Exception as e:  # broad: reported as a finding
            return _error("rollback-raised", e)
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
