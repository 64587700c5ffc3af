"""What a running pass reaches through its context: the editor and the analyses."""

from __future__ import annotations

import torch

import fxpass as fp
from fxpass.core.analysis_manager import AnalysisManager
from fxpass.edit.editor import Editor, active_listener

aten = torch.ops.aten


class _Events(fp.Instrumentation):
    def __init__(self):
        self.events = []

    def on_change(self, event, ctx):
        self.events.append(event)


def _clone_input(gm):
    """Insert a clone of the input in front of its first user, through ctx.editor."""
    ctx = fp.current_context()
    assert active_listener() is ctx and isinstance(ctx.analyses, AnalysisManager)
    x = next(n for n in gm.graph.nodes if n.op == "placeholder")
    user = next(iter(x.users))
    clone = ctx.editor.insert(aten.clone.default, (x,), rule="clone", origin=[x], before=user)
    ctx.editor.replace_input(user, x, clone, rule="clone")
    return True


def test_ctx_editor_is_the_runs_editor_and_names_the_running_pass():
    gm = torch.fx.symbolic_trace(lambda x: torch.relu(x) * 2)
    seen = _Events()
    fp.Pipeline([_clone_input]).run(gm, instrument=[seen])
    assert [e.kind for e in seen.events] == ["insert", "modify"]
    clone = next(n for n in gm.graph.nodes if n.target is aten.clone.default)
    assert clone.meta["fxpass_provenance"]["pass"] == "_clone_input"
    assert clone.meta["from_node"][0].name == "x"
    assert active_listener() is None and fp.current_context() is None


def test_the_editor_asks_the_debug_counter_of_the_run():
    gm = torch.fx.symbolic_trace(lambda x: torch.relu(x) * 2)
    stopped = {}

    def asks(gm):
        stopped["allowed"] = fp.current_context().editor.allow()
        return False

    fp.Pipeline([asks]).run(gm, debug_counter=fp.DebugCounter(count=0))
    assert stopped == {"allowed": False}
    assert Editor(None).allow() and Editor(None).pass_name == "rewrite"
