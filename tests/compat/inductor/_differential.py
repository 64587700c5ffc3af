"""One random case (:mod:`_random_patterns`) run through Inductor's pattern matcher and
through fxpass's drop-in, and the verdict::

    verdict = compare(random_case(random.Random(seed)))
    assert verdict.agree, verdict

Each side registers the case's pair with ``register_replacement(search, replacement,
case.search_inputs, fwd_only, pass_)`` in a fresh ``PatternMatcherPass`` and applies it to
its own copy of the program's graph (traced into Inductor's dialect, fake values on every
node). Where Inductor succeeds, fxpass must leave the same thing: the same number of
matches, the same nodes — compared as a multiset of structural signatures (each node's
target and, recursively, its arguments'), so dead code counts but names and order do not —
and bit-equal outputs. Where Inductor fails (it raises while registering or applying, or
leaves a graph that does not run), fxpass must fail the same way (the same exception type
at the same stage, as it mirrors some of Inductor's errors) or leave a valid graph: it lints,
runs, and, where the replacement is equivalent, computes the program's outputs.
Wherever fxpass leaves a graph, every call node must hold a ``meta['val']`` of the shape
and dtype a fresh propagation gives.

``Verdict.kind`` names the class of the case (``"same"``, ``"inductor fails at apply:
TypeError"``...): a fuzzer groups cases by it, and writes out ``case.source`` for a
disagreement.
"""

from __future__ import annotations

import collections
import copy
import logging
from dataclasses import dataclass
from typing import Any

import torch
from _ind_support import make_graph, pattern_matcher, same
from _random_patterns import Case
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

__all__ = ["Outcome", "Verdict", "compare", "outcome", "signatures"]


@dataclass
class Outcome:
    """What one matcher did: ``stage`` is ``"register"``, ``"apply"`` or ``"run"`` (where it
    failed, ``error`` saying how) or ``"ok"``."""

    stage: str
    error: str = ""
    error_type: str = ""
    count: int = -1
    gm: torch.fx.GraphModule | None = None
    out: Any = None


@dataclass
class Verdict:
    agree: bool
    kind: str
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.kind}: {self.detail}" if self.detail else self.kind


def outcome(matcher: str, case: Case, gm: torch.fx.GraphModule) -> Outcome:
    """Register the case's pair with ``matcher`` (``"inductor"``/``"fxpass"``), apply it to a
    copy of ``gm``, run the result on the case's inputs."""
    pm = pattern_matcher(matcher)
    p = pm.PatternMatcherPass()
    logging.disable(logging.WARNING)  # Inductor logs a traceback for a failed trace
    try:
        try:
            pm.register_replacement(
                case.search, case.replacement, list(case.search_inputs), pm.fwd_only, p
            )
        except Exception as e:  # broad: what the reference raises is part of the verdict
            return Outcome("register", _one_line(e), type(e).__name__)
        g = copy.deepcopy(gm)
        try:
            n = p.apply(g.graph)
        except Exception as e:  # broad: as above
            return Outcome("apply", _one_line(e), type(e).__name__)
    finally:
        logging.disable(logging.NOTSET)
    try:
        g.graph.lint()
        g.recompile()
        out = g(*case.inputs)
    except Exception as e:  # broad: a graph that does not run is a verdict, not a crash
        return Outcome("run", _one_line(e), type(e).__name__, n, g)
    return Outcome("ok", count=n, gm=g, out=out)


def signatures(gm: torch.fx.GraphModule) -> collections.Counter:
    """Each non-input node as its target and, recursively, its arguments' signatures."""
    memo: dict[torch.fx.Node, Any] = {}

    def sig(a: Any) -> Any:
        if isinstance(a, torch.fx.Node):
            if a not in memo:
                if a.op == "placeholder":
                    memo[a] = a.target
                else:
                    kw = tuple(sorted((k, sig(v)) for k, v in a.kwargs.items()))
                    memo[a] = (str(a.target), sig(a.args), kw)
            return memo[a]
        if isinstance(a, (list, tuple)):
            return tuple(sig(x) for x in a)
        return repr(a)

    return collections.Counter(repr(sig(n)) for n in gm.graph.nodes if n.op != "placeholder")


def compare(case: Case) -> Verdict:
    """The verdict on one case (see the module docstring)."""
    gm = make_graph(case.program, *case.inputs)
    theirs = outcome("inductor", case, gm)
    ours = outcome("fxpass", case, gm)
    if theirs.stage == "ok":
        if ours.stage != "ok":
            return Verdict(False, f"fxpass fails at {ours.stage}", ours.error)
        if ours.count != theirs.count:
            return Verdict(False, "match count", f"Inductor {theirs.count}, fxpass {ours.count}")
        if signatures(ours.gm) != signatures(theirs.gm):
            return Verdict(
                False,
                "graph after apply",
                f"Inductor:\n{theirs.gm.graph}\nfxpass:\n{ours.gm.graph}",
            )
        if not same(ours.out, theirs.out):
            return Verdict(False, "outputs", "the two graphs compute different values")
        return _valid(case, ours, "same")
    kind = f"inductor fails at {theirs.stage}: {theirs.error_type}"
    if ours.stage == theirs.stage and ours.error_type == theirs.error_type:
        return Verdict(True, kind + " (fxpass too)")
    if ours.stage != "ok":
        return Verdict(False, kind, f"fxpass fails at {ours.stage}: {ours.error}")
    return _valid(case, ours, kind + " (fxpass valid)")


def _valid(case: Case, ours: Outcome, kind: str) -> Verdict:
    if case.equivalent and not _close(ours.out, case.program(*case.inputs)):
        return Verdict(False, kind, "fxpass's graph does not compute the program's outputs")
    bad = _stale_values(ours.gm, case.inputs)
    if bad:
        return Verdict(False, kind, f"meta['val'] differs from a fresh propagation at {bad}")
    return Verdict(True, kind)


def _stale_values(gm: torch.fx.GraphModule, inputs: list[torch.Tensor]) -> list[str]:
    """The call nodes whose ``meta['val']`` is missing or not what propagation gives."""
    kept = {n: n.meta.get("val") for n in gm.graph.nodes}
    fresh = copy.deepcopy(gm)
    mode = FakeTensorMode()
    FakeTensorProp(fresh, mode).propagate(*[mode.from_tensor(x) for x in inputs])
    bad = []
    for n, m in zip(gm.graph.nodes, fresh.graph.nodes):
        if n.op != "call_function":
            continue
        old, new = kept[n], m.meta.get("val")
        if isinstance(new, torch.Tensor) and not (
            isinstance(old, torch.Tensor) and old.shape == new.shape and old.dtype == new.dtype
        ):
            bad.append(n.name)
    return bad


def _close(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.allclose(a, b, atol=1e-5, rtol=1e-5)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(map(_close, a, b))
    return a == b


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:300] if text else ''}"
