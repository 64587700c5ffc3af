"""``install()``: code importing ``torch._inductor.pattern_matcher`` gets fxpass's objects (and
Inductor's own passes keep Inductor's), ``uninstall()`` undoes it; a pass installed at
Inductor's post-grad hook runs inside ``torch.compile`` and matches what Inductor's does."""

from __future__ import annotations

import copy
import importlib
import sys

import torch
from _ind_support import MATCHERS, pattern_matcher

import fxpass.compat.inductor as fxi

NAME = "torch._inductor.pattern_matcher"


def test_install_redirects_imports_and_uninstall_restores_them():
    import torch._inductor.fx_passes.post_grad as post_grad

    original = importlib.import_module(NAME)
    assert not fxi.is_installed()
    with fxi.installed() as facade:
        import torch._inductor.pattern_matcher as pm
        from torch._inductor.pattern_matcher import PatternMatcherPass, register_replacement

        assert pm is facade is sys.modules[NAME] is torch._inductor.pattern_matcher
        assert register_replacement is fxi.register_replacement
        assert PatternMatcherPass is fxi.PatternMatcherPass
        assert pm.CallFunction is fxi.CallFunction and pm.MULTIPLE is fxi.MULTIPLE
        assert pm.is_mutation_op is original.is_mutation_op  # Inductor's own helpers stay
        assert post_grad.register_replacement is original.register_replacement  # and its passes
        assert all(type(p) is original.PatternMatcherPass for p in post_grad.pass_patterns)
        assert fxi.install() is facade  # twice is harmless
    assert sys.modules[NAME] is original and not fxi.is_installed()
    from torch._inductor.pattern_matcher import register_replacement

    assert register_replacement is original.register_replacement


def test_install_sets_the_improvements_and_installed_restores_them():
    assert not fxi.improvements_on()
    with fxi.installed(improve=True):
        assert fxi.improvements_on()
        assert fxi.PatternMatcherPass()._improving()
        assert not fxi.PatternMatcherPass(improve=False)._improving()
    assert not fxi.improvements_on()
    with fxi.improvements():
        assert fxi.improvements_on()
    assert not fxi.improvements_on()


def _search(x, y):
    return torch.relu(x + y) * 2.0


def _replace(x, y):
    return torch.clamp_min(y + x, 0.0) * 2.0


def test_a_pass_at_inductor_s_post_grad_hook_runs_inside_torch_compile():
    """fxpass's pass at the hook, inside torch.compile; Inductor's pass applied to a copy of
    the same post-grad graph matches as much."""

    def f(x, y):
        return torch.relu(x + y) * 2.0 + torch.relu(x + 2 * y) * 2.0

    x, y = torch.randn(4, 8), torch.randn(4, 8)
    passes = {}
    for m in MATCHERS:
        pm = pattern_matcher(m)
        passes[m] = pm.PatternMatcherPass(pass_name="hooked")
        pm.register_replacement(_search, _replace, [x, y], pm.fwd_only, passes[m])
    seen = []

    def hook(graph):
        seen.append(copy.deepcopy(graph.owning_module))
        passes["fxpass"](graph)
        seen.append(str(graph))

    torch._dynamo.reset()
    out = torch.compile(f, options={"post_grad_custom_post_pass": hook})(x, y)
    torch.testing.assert_close(out, f(x, y))
    assert passes["fxpass"].stats.matches == 2 and "clamp_min" in seen[1]
    assert passes["inductor"].apply(seen[0].graph) == 2
