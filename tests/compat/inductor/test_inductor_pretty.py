"""PatternPrettyPrinter writes fxpass's patterns as Inductor's printer writes Inductor's:
the same text for the patterns register_replacement registers (vLLM's dump_patterns)."""

from __future__ import annotations

import torch
from _ind_support import pattern_matcher


def rms(x, w):
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
    return w * h.to(x.dtype)


def add_rms(x, residual, w):  # multi-output, a value used twice
    s = x + residual
    return rms(s, w), s


def printed(matcher, search, examples):
    pm = pattern_matcher(matcher)
    p = pm.PatternMatcherPass()
    pm.register_replacement(search, search, examples, pm.fwd_only, p)
    (entry,) = [e for entries in p.patterns.values() for e in entries]
    pp = pm.PatternPrettyPrinter()
    out = pp.pretty_print(entry.pattern)
    named = [
        f"{pp.memoized_objs_names[k]} = {pp.memoized_objs_pp[k]}" for k in pp.memoized_objs_names
    ]
    return "\n".join([*named, out]), pm.PatternPrettyPrinter.run(entry.pattern)


def test_printed_as_inductor_prints_it():
    for search, examples in (
        (rms, [torch.empty(2, 16, dtype=torch.float16), torch.empty(16, dtype=torch.float16)]),
        (add_rms, [torch.empty(2, 16), torch.empty(2, 16), torch.empty(16)]),
    ):
        ours, theirs = printed("fxpass", search, examples), printed("inductor", search, examples)
        assert ours == theirs
        assert "= CallFunction(" in ours[0]  # call expressions named, as Inductor's


def test_run_refuses_what_is_no_pattern():
    import pytest

    from fxpass.compat.inductor import PatternPrettyPrinter

    with pytest.raises(TypeError, match="takes a pattern expression"):
        PatternPrettyPrinter.run(3)
