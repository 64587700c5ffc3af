import torch

from fxpass.fxutil.fx_internals import release_name, relink_as_copied, rename_node


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


def _two_branches() -> torch.fx.Graph:
    g = torch.fx.Graph()
    x = g.placeholder("x")
    a = g.call_function(torch.relu, (x,))
    b = g.call_function(torch.neg, (x,))
    g.output((g.call_function(torch.add, (b, a)),))
    return g


def test_relink_as_copied_leaves_the_graph_as_a_copy_in_that_order():
    g = _two_branches()
    x, a, b, add, out = g.nodes
    order = [x, b, a, add, out]
    copy = torch.fx.Graph()
    env = {}
    for n in order:
        env[n] = copy.node_copy(n, env.__getitem__)
    assert relink_as_copied(g, order)
    assert list(g.nodes) == order  # the same objects, in the new order
    assert [[u.name for u in n.users] for n in g.nodes] == [
        [u.name for u in n.users] for n in copy.nodes
    ]
    assert [n.name for n in g.find_nodes(op="call_function", target=torch.neg, sort=False)] == [
        "neg"
    ]
    g.lint()
    assert (
        g.create_node("call_function", torch.relu).name
        == copy.create_node("call_function", torch.relu).name
    )


def test_relink_as_copied_refuses_when_a_copy_would_rename_a_node():
    g = _two_branches()
    nodes = list(g.nodes)
    nodes[1].name = "list"  # a builtin's name: a copy would call it list_1
    assert not relink_as_copied(g, nodes[::-1])
    assert list(g.nodes) == nodes
