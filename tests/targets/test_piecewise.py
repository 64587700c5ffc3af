import pytest
import torch
from _target_models import aten, convnet, convnet_ep, rsqrt_to_reciprocal_sqrt

import fxpass as fp
from fxpass.targets.piecewise import PiecewiseGraph, piecewise, split, split_predicate

import _models

SDPA = aten.scaled_dot_product_attention.default


def _llama(layers=2):
    """The float32 decoder exported without decompositions: SDPA stays one op."""
    ep = _models.exported(decompose=False, layers=layers, dtype=torch.float32)
    (ids,) = _models.decoder(layers=layers, dtype=torch.float32).example_inputs()
    return ep.module(), ids


def _count_all(modules, target):
    return sum(_models.count(m, target) for m in modules)


def test_split_at_attention_recombines_to_the_same_outputs():
    gm, ids = _llama()
    before = str(gm.graph)
    pg = split(gm, "attention")
    assert isinstance(pg, PiecewiseGraph)
    assert [p.is_split for p in pg.pieces] == [False, True, False, True, False]
    for piece in pg.split_pieces:
        assert _models.count(piece.module, SDPA) == 1
    assert _count_all([p.module for p in pg.pieces if not p.is_split], SDPA) == 0
    torch.testing.assert_close(pg(ids), gm(ids))
    flat = pg.stitch()
    assert _models.count(flat, SDPA) == 2
    assert len(flat.graph.nodes) == len(gm.graph.nodes)
    torch.testing.assert_close(flat(ids), gm(ids))
    assert str(gm.graph) == before, "splitting does not touch the original"


def test_pipeline_runs_on_each_piece_and_stitches_back():
    gm, ids = _llama()
    norms = _models.count(gm, aten.rsqrt.default)
    pg = piecewise(gm, [rsqrt_to_reciprocal_sqrt], "attention")
    assert len(pg.reports) == 3  # the three pieces between and around two attentions
    rewritten = sum(r.root.children[0].stats.get("rsqrt_rewritten", 0) for r in pg.reports)
    assert rewritten == norms == 5
    flat = pg.stitch()
    assert _models.count(flat, aten.rsqrt.default) == 0
    assert _models.count(flat, aten.reciprocal.default) == norms
    torch.testing.assert_close(pg(ids), gm(ids))
    torch.testing.assert_close(flat(ids), gm(ids))


def test_a_failing_pass_puts_every_piece_back():
    gm, _ = _llama()
    pg = split(gm, "attention")
    texts = [str(p.module.graph) for p in pg.pieces]
    seen = []

    def fail_on_third_piece(g):
        seen.append(g)
        rsqrt_to_reciprocal_sqrt(g)
        if len(seen) == 3:
            raise RuntimeError("third piece")

    with pytest.raises(fp.PassFailedError, match="in piece 'submod_4'; every piece was put back"):
        pg.run(fail_on_third_piece)
    assert [str(p.module.graph) for p in pg.pieces] == texts


def test_split_on_exported_conv_net_at_any_op():
    ep = convnet_ep()
    model = convnet()
    (x,) = model.example_inputs()
    gm = ep.module()
    pg = split(gm, aten.convolution.default)
    assert len(pg.split_pieces) == 2
    torch.testing.assert_close(pg(x), model(x))
    by_name = split(gm, "aten.convolution")
    assert len(by_name.split_pieces) == 2
    by_predicate = split(gm, lambda n: n.target is aten.relu.default)
    assert len(by_predicate.split_pieces) == 2
    torch.testing.assert_close(by_predicate.stitch()(x), model(x))


def test_multi_output_split_ops_keep_their_getitems():
    ep = convnet_ep()
    gm = ep.module()
    # batch norm returns a tuple: its getitem must stay in the split piece
    pg = split(gm, aten._native_batch_norm_legit_no_training.default)
    for piece in pg.split_pieces:
        targets = [n.target for n in piece.module.graph.nodes if n.op == "call_function"]
        assert targets[0] is aten._native_batch_norm_legit_no_training.default
        assert all(t.__name__ == "getitem" for t in targets[1:])
    (x,) = convnet().example_inputs()
    torch.testing.assert_close(pg.stitch()(x), convnet()(x))


def test_compile_each_piece():
    gm, ids = _llama(layers=1)
    pg = split(gm, "attention")
    compiled = []

    def compiler(piece, inputs):
        compiled.append(len(inputs))
        return piece.forward

    pg.compile(compiler)
    assert len(compiled) == 2 and all(compiled)
    torch.testing.assert_close(pg(ids), gm(ids))
    with pytest.raises(ValueError, match="cannot inline compiled pieces"):
        pg.stitch()


def test_bad_split_requests_say_what_to_do():
    gm, _ = _llama(layers=1)
    with pytest.raises(ValueError, match="no node in the graph matches"):
        split(gm, aten.convolution.default)
    with pytest.raises(ValueError, match="there is no op torch.ops.aten.nope"):
        split_predicate("aten.nope.default")
    with pytest.raises(ValueError, match="use 'attention'"):
        split_predicate("attn")


def test_split_predicate_matches_overloads_packets_and_functions():
    g = torch.fx.Graph()
    x = g.placeholder("x")
    mm = g.call_function(aten.mm.default, (x, x))
    add = g.call_function(aten.add.Tensor, (mm, x))
    relu = g.call_function(torch.relu, (add,))
    method = g.call_method("relu", (relu,))
    g.output(method)
    assert [n for n in g.nodes if split_predicate(aten.mm.default)(n)] == [mm]
    assert [n for n in g.nodes if split_predicate("aten.add")(n)] == [add]
    assert [n for n in g.nodes if split_predicate([torch.relu, aten.add, 3])(n)] == [add, relu]
    assert not any(map(split_predicate(SDPA), g.nodes))
