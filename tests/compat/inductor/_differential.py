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
import contextlib
import copy
import logging
import os
from collections.abc import Iterator
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
    #: the names of the error's classes, its own first (an fxpass error may also be the
    #: builtin error Inductor raises there: ``ReplacementTypeError`` is a ``TypeError``)
    error_types: tuple[str, ...] = ()
    count: int = -1
    gm: torch.fx.GraphModule | None = None
    out: Any = None
    #: matches Inductor's re-traced pattern rejected where it spells sizes as graph nodes
    #: (``sym_size`` ...: they match only the same spelling) or as its size inputs
    #: (``KeywordArg('arg0_1')``: one for sizes the graph reads apart), from its log
    size_misses: int = 0

    @property
    def error_type(self) -> str:
        """The name of the error's own class ("" where it did not fail)."""
        return self.error_types[0] if self.error_types else ""


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
    with _inductor_log(debug=matcher == "inductor") as log:
        result = _outcome(matcher, case, gm)
    result.size_misses = sum(
        line.startswith("Specific pattern match")
        and " Match(" not in line
        and ("aten.sym_" in line or "KeywordArg('arg" in line)
        for line in log
    )
    return result


@contextlib.contextmanager
def _inductor_log(debug: bool) -> Iterator[list[str]]:
    """The pattern matcher's log lines, kept instead of printed; ``debug``: every node's
    (``TORCHINDUCTOR_PATTERN_MATCH_DEBUG=all``, for Inductor's)."""
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    logger = logging.getLogger("torch._inductor.pattern_matcher")
    handler, propagate, level = Keep(), logger.propagate, logger.level
    old = os.environ.get("TORCHINDUCTOR_PATTERN_MATCH_DEBUG")
    if debug:
        os.environ["TORCHINDUCTOR_PATTERN_MATCH_DEBUG"] = "all"
    else:
        os.environ.pop("TORCHINDUCTOR_PATTERN_MATCH_DEBUG", None)
    logger.addHandler(handler)
    logger.propagate = False
    logger.setLevel(logging.WARNING)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate
        logger.setLevel(level)
        if old is None:
            os.environ.pop("TORCHINDUCTOR_PATTERN_MATCH_DEBUG", None)
        else:
            os.environ["TORCHINDUCTOR_PATTERN_MATCH_DEBUG"] = old


def _outcome(matcher: str, case: Case, gm: torch.fx.GraphModule) -> Outcome:
    pm = pattern_matcher(matcher)
    p = pm.PatternMatcherPass()
    try:
        pm.register_replacement(
            case.search, case.replacement, list(case.search_inputs), pm.fwd_only, p
        )
    except Exception as e:  # broad: what the reference raises is part of the verdict
        return Outcome("register", _one_line(e), _names(e))
    g = copy.deepcopy(gm)
    try:
        n = p.apply(g.graph)
    except Exception as e:  # broad: as above
        return Outcome("apply", _one_line(e), _names(e))
    try:
        g.graph.lint()
        g.recompile()
        out = g(*case.inputs)
    except Exception as e:  # broad: a graph that does not run is a verdict, not a crash
        return Outcome("run", _one_line(e), _names(e), n, g)
    return Outcome("ok", count=n, gm=g, out=out)


def _names(e: BaseException) -> tuple[str, ...]:
    return tuple(c.__name__ for c in type(e).__mro__)


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


def program_graph(case: Case, dynamic: bool = False) -> torch.fx.GraphModule:
    """The case's program in Inductor's dialect; ``dynamic``: with symbolic sizes (as
    torch.compile's dynamic-shape graphs have them: ``sym_size`` nodes feed the views)."""
    if not dynamic:
        return make_graph(case.program, *case.inputs)
    from torch._inductor.decomposition import select_decomp_table
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(case.program, select_decomp_table(), tracing_mode="symbolic")(*case.inputs)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return gm


def compare(case: Case, dynamic: bool = False) -> Verdict:
    """The verdict on one case (see the module docstring); ``dynamic``: on the program
    traced with symbolic sizes."""
    gm = program_graph(case, dynamic)
    theirs = outcome("inductor", case, gm)
    ours = outcome("fxpass", case, gm)
    if theirs.stage == "ok":
        if ours.stage != "ok":
            return Verdict(False, f"fxpass fails at {ours.stage}", ours.error)
        if dynamic and theirs.count < ours.count <= theirs.count + theirs.size_misses:
            # Inductor re-traces the search function for each match and compares the sizes
            # it computes by their spelling (``sym_size`` of a view where the graph has
            # ``sym_numel`` of its input): a miss of Inductor's; fxpass compares values
            return _valid(case, ours, "inductor misses: a size spelled otherwise (fxpass valid)")
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
    if ours.stage == "run":  # a graph that does not run is never right
        return Verdict(False, kind, f"fxpass's graph does not run: {ours.error}")
    if ours.stage == theirs.stage and theirs.error_type in ours.error_types:
        return Verdict(True, kind + " (fxpass too)")
    if ours.stage != "ok":
        return Verdict(False, kind, f"fxpass fails at {ours.stage}: {ours.error}")
    return _valid(case, ours, kind + " (fxpass valid)")


def _valid(case: Case, ours: Outcome, kind: str) -> Verdict:
    if case.equivalent and not _close(ours.out, case.program(*case.inputs)):
        return Verdict(False, kind, "fxpass's graph does not compute the program's outputs")
    bad = _stale_values(ours.gm, case.inputs) if not _symbolic(ours.gm) else []
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


def _symbolic(gm: torch.fx.GraphModule) -> bool:
    return any(
        isinstance(n.meta.get("val"), torch.Tensor)
        and any(isinstance(d, torch.SymInt) for d in n.meta["val"].shape)
        for n in gm.graph.nodes
    )


def _close(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.allclose(a, b, atol=1e-5, rtol=1e-5)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(map(_close, a, b))
    return a == b


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:300] if text else ''}"
