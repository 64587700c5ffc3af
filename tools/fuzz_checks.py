"""What the rewrite fuzzers check with, and how a case is written out: findings, exports
(remembered), outputs compared, ``meta['val']`` against a fresh ``FakeTensorProp``, fxpass
rules built from a :class:`~fuzz_patterns.Cut`, repro scripts."""

from __future__ import annotations

import collections
import copy
import dataclasses
import inspect
import traceback
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from fuzz_programs import Program, export_program
from torch import fx

__all__ = [
    "Finding",
    "Skip",
    "commented",
    "error_finding",
    "exported",
    "fresh_values",
    "graph_module",
    "layout",
    "make_rule",
    "no_commute",
    "run_graph",
    "same_outputs",
    "script",
    "torchlike",
    "value_mismatch",
]


class Skip(Exception):
    """The case says nothing about fxpass (the program does not export, torch fails)."""


@dataclasses.dataclass(frozen=True)
class Finding:
    """A disagreement: ``key`` names its class (what the driver deduplicates by)."""

    key: str
    detail: str


_EXPORTED: collections.OrderedDict = collections.OrderedDict()


def exported(program: Program) -> torch.export.ExportedProgram:
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


def graph_module(ep: torch.export.ExportedProgram, variant: str) -> fx.GraphModule:
    return ep.graph_module if variant == "lifted" else ep.module()


def run_graph(ep: torch.export.ExportedProgram, gm: fx.GraphModule, variant: str, inputs) -> Any:
    if variant == "lifted":
        return ep.module()(*inputs)
    return gm(*inputs)


def same_outputs(got: Any, want: Any, exact: bool) -> str | None:
    try:
        if exact:
            torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
        else:
            torch.testing.assert_close(got, want, equal_nan=True)
    except AssertionError as e:
        return str(e).strip().splitlines()[0]
    return None


def layout(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return (tuple(v.shape), v.dtype, tuple(v.stride()), v.device.type)
    if isinstance(v, (list, tuple)):
        return tuple(layout(x) for x in v)
    return v if isinstance(v, (int, float, bool, type(None))) else type(v).__name__


def fresh_values(gm: fx.GraphModule) -> dict[str, Any]:
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
        return {n.name: layout(n.meta.get("val")) for n in gm.graph.nodes}
    finally:
        for n, v in saved.items():
            if v is None:
                n.meta.pop("val", None)
            else:
                n.meta["val"] = v


def value_mismatch(gm: fx.GraphModule, nodes: Iterable[fx.Node]) -> str | None:
    nodes = [n for n in nodes if n.op not in ("placeholder", "output")]
    if not nodes:
        return None
    fresh = fresh_values(gm)
    for n in nodes:
        if n.meta.get("val") is None:
            if fresh[n.name] is None:  # an op that returns nothing (export's asserts)
                continue
            return f"{n.name} ({n.target}) has no meta['val']"
        have = layout(n.meta["val"])
        if have != fresh[n.name]:
            return f"{n.name} ({n.target}): meta['val'] {have} != propagated {fresh[n.name]}"
    return None


def error_finding(stage: str, e: BaseException) -> Finding:
    tb = "".join(traceback.format_exception(type(e), e, e.__traceback__)[-6:])
    first = (str(e).strip().splitlines() or [""])[0][:300]
    return Finding(f"{stage}:{type(e).__name__}", f"{type(e).__name__}: {first}\n{tb}")


def no_commute(pattern: Any) -> None:
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


def make_rule(cut: Any, commute: bool, replacement: Any = None, **options: Any):
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
        no_commute(rule.pattern)
    return rule


def torchlike(m: Any, params: tuple[str, ...]) -> bool:
    """Whether torch's matcher could report ``m``: each input (``params``) binds its own
    node, one that the match does not also cover, or a literal (torch's ``SubgraphMatcher``
    binds a pattern placeholder to a literal argument as well: ``x + 2.0``)."""
    bound = [m.bindings[p] for p in params if p in m.bindings]
    nodes = [v for v in bound if isinstance(v, fx.Node)]
    return len(set(nodes)) == len(nodes) and not (set(nodes) & set(m.nodes))


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


def script(fuzzer: Any, case: Any, finding: Finding, explain: str) -> str:
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


def commented(text: str) -> str:
    return "".join(f"# {line}\n" for line in text.splitlines())
