import torch

from fxpass.fxutil.fx import release_name, rename_node


def test_release_name_lets_a_node_take_an_erased_nodes_name():
    g = torch.fx.Graph()
    x = g.placeholder("x")
    a = g.call_function(torch.relu, (x,))
    g.output(a)
    g.output_node().args = (x,)
    g.erase_node(a)
    b = g.call_function(torch.neg, (x,), name="relu")
    assert b.name != "relu"
    release_name(g, "relu")
    rename_node(b, "relu")
    assert b.name == "relu"
