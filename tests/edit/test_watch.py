import operator

import pytest
import torch
from torch import fx

from fxpass.edit.watch import watch_edits


class _M(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x + 1)


def _edit(graph: fx.Graph) -> tuple[fx.Node, fx.Node]:
    """What a handler does: make a node, reroute, erase the old one, itself."""
    add = next(n for n in graph.nodes if n.target is operator.add)
    with graph.inserting_after(add):
        mul = graph.call_function(operator.mul, add.args)
    add.replace_all_uses_with(mul)
    graph.erase_node(add)
    return add, mul


@pytest.mark.parametrize("owned", [True, False])
def test_watch_edits_sees_a_handlers_own_edits(owned):
    gm = fx.symbolic_trace(_M())
    graph = gm.graph
    if not owned:  # a graph no module owns: compared before and after
        graph = fx.Graph()
        graph.output(graph.graph_copy(gm.graph, {}))
        assert graph.owning_module is None
    made, gone = [], []
    with watch_edits(graph, made.append, gone.append):
        add, mul = _edit(graph)
    assert made == [mul] and gone == [add]


def test_watch_edits_sees_nothing_after_the_block_even_when_the_block_fails():
    gm = fx.symbolic_trace(_M())
    made, gone = [], []
    with pytest.raises(ValueError), watch_edits(gm.graph, made.append, gone.append):
        raise ValueError("handler failed")
    _edit(gm.graph)
    assert made == [] and gone == []


def test_watch_edits_sees_the_node_before_its_arguments_are_dropped():
    gm = fx.symbolic_trace(_M())
    args = []
    with watch_edits(gm.graph, lambda n: None, lambda n: args.append(n.args)):
        add, _ = _edit(gm.graph)
    assert add.args[0] is None  # erased: torch drops its arguments
    assert len(args) == 1 and args[0][0].op == "placeholder" and args[0][1] == 1
