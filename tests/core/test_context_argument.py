"""A pass that asks for its context by a parameter named ``ctx`` is handed it."""

from __future__ import annotations

import torch

import fxpass as fp
from fxpass.core.contract import is_lowering, takes_context
from fxpass.core.pass_registry import Registry


def _gm() -> torch.fx.GraphModule:
    return torch.fx.symbolic_trace(lambda x: torch.relu(x) + 1)


def test_a_function_pass_asking_for_ctx_gets_the_run_context_and_edits_through_its_editor():
    seen = []

    def drop_relu(gm, ctx):
        seen.append((ctx, list(ctx.pass_path)))
        (relu,) = [n for n in gm.graph.nodes if n.target is torch.relu]
        if ctx.editor.allow():
            ctx.editor.replace_all_uses(relu, relu.args[0], "drop_relu")
            ctx.stat("dropped")
        return True

    events = []

    class Events(fp.core.Instrumentation):
        def on_change(self, event, ctx):
            events.append(event.rule)

    gm = _gm()
    result = fp.Pipeline([drop_relu], instrument=[Events()]).run(gm)
    assert isinstance(seen[0][0], fp.PassContext) and seen[0][1] == ["drop_relu"]
    assert result.report.stats()["drop_relu.dropped"] == 1 and events == ["drop_relu"]
    assert not any(n.target is torch.relu for n in gm.graph.nodes)
    # the debug counter the run was given is the one the handed editor asks
    gm = _gm()
    fp.Pipeline([drop_relu]).run(gm, debug_counter=fp.core.DebugCounter(count=0))
    assert any(n.target is torch.relu for n in gm.graph.nodes)


def test_passes_that_do_not_ask_are_called_as_before():
    calls = []

    def plain(gm):
        calls.append(fp.current_context() is not None)
        return False

    def lowering(gm, sample_inputs):
        calls.append(list(sample_inputs))
        return gm

    fp.Pipeline([plain, lowering]).run(_gm(), [torch.ones(2)])
    assert calls[0] is True and torch.equal(calls[1][0], torch.ones(2))


def test_ctx_is_neither_an_option_nor_a_lowering_input():
    def with_option(gm, ctx, *, scale: float = 1.0):
        return False

    def lowering_with_ctx(gm, sample_inputs, ctx):
        return gm

    assert takes_context(with_option) and not is_lowering(with_option)
    assert is_lowering(lowering_with_ctx) and takes_context(lowering_with_ctx)
    assert not takes_context(lambda gm: None) and not takes_context(lambda gm, *ctx: None)
    registry = Registry()
    registry.register("ctx_option_example")(with_option)
    assert list(registry.get("ctx_option_example").options) == ["scale"]
    seen = []

    def lowering_seen(gm, sample_inputs, ctx):
        seen.append((len(sample_inputs), ctx.pass_path[-1]))
        return gm

    fp.Pipeline([lowering_seen]).run(_gm(), [torch.ones(2)])
    assert seen == [(1, "lowering_seen")]


def test_a_class_call_asking_for_ctx_gets_it():
    class Count(fp.Pass):
        def call(self, gm, ctx):
            ctx.stat("nodes", len(gm.graph.nodes))
            return False

    result = fp.Pipeline([Count()]).run(_gm())
    assert result.report.stats()["count.nodes"] == 4
