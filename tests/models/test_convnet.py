import pytest
import torch

from fxpass.models.convnet import ConvNetConfig, build_convnet


def test_forward_shape_and_determinism():
    a, b = build_convnet(channels=(4, 8)), build_convnet(channels=(4, 8))
    (x,) = a.example_inputs()
    assert a(x).shape == (2, 10)
    torch.testing.assert_close(a(x), b(x))  # same seed, same weights
    assert not torch.equal(a(x), build_convnet(channels=(4, 8), seed=1)(x))


def test_exports_with_expected_ops():
    model = build_convnet()
    ep = torch.export.export(model, model.example_inputs()).run_decompositions()
    targets = [n.target for n in ep.graph.nodes if n.op == "call_function"]
    aten = torch.ops.aten
    assert targets.count(aten.convolution.default) == 2
    assert targets.count(aten.relu.default) == 2
    assert aten.addmm.default in targets
    torch.testing.assert_close(ep.module()(*model.example_inputs()), model(*model.example_inputs()))


def test_train_mode_exports_buffer_mutations():
    model = build_convnet(train=True)
    ep = torch.export.export(model, model.example_inputs()).run_decompositions()
    mutated = set(ep.graph_signature.buffers_to_mutate.values())
    assert "blocks.0.bn.running_mean" in mutated
    assert "blocks.1.bn.num_batches_tracked" in mutated


def test_inplace_relu_is_kept_by_export():
    model = build_convnet(inplace_relu=True)
    ep = torch.export.export(model, model.example_inputs())
    assert any(n.target is torch.ops.aten.relu_.default for n in ep.graph.nodes)


def test_bad_config_says_what_to_do():
    with pytest.raises(ValueError, match="at least one block"):
        ConvNetConfig(channels=())
    with pytest.raises(ValueError, match="too small"):
        ConvNetConfig(channels=(4, 4, 4, 4, 4), image_size=16)
