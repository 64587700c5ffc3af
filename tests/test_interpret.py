"""The seed's Level 1 examples as interpreter passes, on exported real models."""

import operator
import re

import pytest
import torch
from targets._target_models import convnet, convnet_ep

import fxpass as fp
from fxpass.interpret import ExportPass, InterpreterPass, ProxyValue, map_args
from fxpass.models.convnet import build_convnet
from fxpass.targets.apply import apply
from fxpass.targets.export import load, save

import _models

aten = torch.ops.aten


class ReplaceInPlaceReluWithOutOfPlaceRelu(InterpreterPass):
    """relu_ is the in-place version. Replace it with relu, the out-of-place version."""

    def call_operator(self, op, args, kwargs, meta):
        if op != aten.relu_.default:
            return super().call_operator(op, args, kwargs, meta)
        return super().call_operator(aten.relu.default, args, kwargs, meta)


class ReplaceAddWithMulSub(InterpreterPass):
    """x + y  ->  x * y - y"""

    def call_operator(self, op, args, kwargs, meta):
        if op != aten.add.Tensor:
            return super().call_operator(op, args, kwargs, meta)
        x, y = args
        mul = super().call_operator(aten.mul.Tensor, (x, y), {}, meta)
        return super().call_operator(aten.sub.Tensor, (mul, y), {}, meta)


class RemoveDetach(InterpreterPass):
    def call_operator(self, op, args, kwargs, meta):
        if op not in (aten.detach.default, aten.detach_copy.default):
            return super().call_operator(op, args, kwargs, meta)
        assert len(args) == 1
        return args[0]


class ScalarToTensor(InterpreterPass):
    def call_operator(self, op, args, kwargs, meta):
        def try_coerce(value, arg):
            return (
                torch.tensor(value)
                if isinstance(value, (float, int, bool)) and isinstance(arg.type, torch.TensorType)
                else value
            )

        args, kwargs = map_args(op, try_coerce, args, kwargs)
        return super().call_operator(op, args, kwargs, meta)


def _calls(gm, target):
    return sum(1 for n in gm.graph.nodes if n.op == "call_function" and n.target is target)


def _assert_metadata(gm):
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        assert "val" in node.meta, node
        assert node.meta.get("stack_trace"), node
        assert node.meta.get("nn_module_stack"), node


def test_one_to_one_inplace_relu_on_exported_convnet():
    model = build_convnet(inplace_relu=True)
    ep = torch.export.export(model, model.example_inputs())
    assert _calls(ep.graph_module, aten.relu_.default) == 2
    result = apply(ep, ReplaceInPlaceReluWithOutOfPlaceRelu())
    gm = result.graph_module
    assert result.modified
    assert _calls(gm, aten.relu_.default) == 0 and _calls(gm, aten.relu.default) == 2
    _assert_metadata(gm)
    new_relu = next(n for n in gm.graph.nodes if n.target is aten.relu.default)
    prov = new_relu.meta["fxpass_provenance"]
    assert prov["pass"] == "replace_in_place_relu_with_out_of_place_relu"
    assert prov["replaced"] == ["relu_"]
    assert re.search(r"test_interpret\.py:\d+$", prov["location"])
    assert new_relu.meta["from_node"][-1].name == "relu_"
    assert result.report.root.children[0].stats["rewritten"] == 2
    result.program.validate()
    (x,) = model.example_inputs()
    torch.testing.assert_close(result.program.module()(x), model(x))


def test_one_to_x_add_becomes_mul_sub():
    class AddModel(torch.nn.Module):
        def forward(self, x, y):
            return x + y

    x, y = torch.randn(4, 8), torch.randn(4, 8)
    gm = torch.export.export(AddModel(), (x, y)).module()
    result = ReplaceAddWithMulSub()(gm)
    new = result.graph_module
    assert _calls(new, aten.add.Tensor) == 0
    assert _calls(new, aten.mul.Tensor) == 1 and _calls(new, aten.sub.Tensor) == 1
    torch.testing.assert_close(new(x, y), x * y - y)


def test_provenance_is_torchs_record_and_its_location_is_looked_up_once_per_run(monkeypatch):
    from torch.fx.traceback import NodeSource, NodeSourceAction

    import fxpass.interpret as interpret

    class TwoAdds(torch.nn.Module):
        def forward(self, x, y):
            return (x + y) + y

    x, y = torch.randn(4, 8), torch.randn(4, 8)
    gm = torch.export.export(TwoAdds(), (x, y)).module()
    adds = [n for n in gm.graph.nodes if n.target is aten.add.Tensor]
    want = {
        n.name: NodeSource(n, "replace_add_with_mul_sub", NodeSourceAction.REPLACE) for n in adds
    }
    lookups = []
    real = interpret.source_location
    monkeypatch.setattr(interpret, "source_location", lambda obj: lookups.append(obj) or real(obj))
    p = ReplaceAddWithMulSub()
    for run in (1, 2):
        new = p(gm).graph_module
        assert len(lookups) == run  # once per run, not once per rewrite
        made = [n for n in new.graph.nodes if n.target in (aten.mul.Tensor, aten.sub.Tensor)]
        assert len(made) == 4
        for n in made:
            (old,) = n.meta["fxpass_provenance"]["replaced"]
            assert n.meta["from_node"] == [want[old]]
            assert n.meta["fxpass_provenance"]["location"] == real(
                ReplaceAddWithMulSub.call_operator
            )


def test_one_to_x_on_the_llama_graph_keeps_a_valid_program(llama_ep):
    adds = _calls(llama_ep.graph_module, aten.add.Tensor)
    muls = _calls(llama_ep.graph_module, aten.mul.Tensor)
    result = apply(llama_ep, ReplaceAddWithMulSub())
    gm = result.graph_module
    assert _calls(gm, aten.add.Tensor) == 0
    assert _calls(gm, aten.mul.Tensor) == muls + adds
    assert _calls(gm, aten.sub.Tensor) >= adds
    result.program.validate()
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is aten.sub.Tensor:
            shapes = [a.meta["val"].shape for a in node.args if isinstance(a, torch.fx.Node)]
            assert node.meta["val"].shape == torch.broadcast_shapes(*shapes)


def test_one_to_none_remove_detach_renames_the_output():
    class Detached(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = convnet()

        def forward(self, x):
            return self.net(x).detach()

    model = Detached()
    (x,) = convnet().example_inputs()
    ep = torch.export.export(model, (x,))
    assert _calls(ep.graph_module, aten.detach.default) == 1
    result = apply(ep, RemoveDetach())
    new = result.program
    assert _calls(new.graph_module, aten.detach.default) == 0
    assert new.graph_signature.user_outputs != ep.graph_signature.user_outputs
    new.validate()
    torch.testing.assert_close(new.module()(x), model(x))


def test_scalars_become_tensor_constants_of_the_program(tmp_path):
    ep = _models.exported(layers=1, dtype=torch.float32)
    (ids,) = _models.decoder(layers=1, dtype=torch.float32).example_inputs()
    result = apply(ep, ScalarToTensor())
    new = result.program
    lifted = new.graph_signature.inputs_to_lifted_tensor_constants
    assert len(lifted) == result.report.root.children[0].stats["rewritten"] > 0
    for node in new.graph_module.graph.nodes:
        if node.target is aten.add.Tensor:
            assert all(not isinstance(a, float) for a in node.args)
    new.validate()
    torch.testing.assert_close(new.module()(ids), ep.module()(ids))
    loaded = load(save(new, tmp_path / "s.pt2"))
    torch.testing.assert_close(loaded.module()(ids), ep.module()(ids))


def test_copying_everything_is_not_a_change():
    gm = convnet_ep().graph_module
    result = InterpreterPass()(gm)
    assert result.modified is False and result.graph_module is gm
    assert result.report.root.children[0].modified is False


def test_multi_output_ops_and_getitems_survive_a_rewrite():
    ep = convnet_ep()  # batch norm and max pool return tuples read with getitem

    class ReluToClampMin(InterpreterPass):
        def call_operator(self, op, args, kwargs, meta):
            if op is aten.relu.default:
                return super().call_operator(aten.clamp_min.default, (args[0], 0.0), {}, meta)
            return super().call_operator(op, args, kwargs, meta)

    result = apply(ep, ReluToClampMin())
    gm = result.graph_module
    assert _calls(gm, aten.clamp_min.default) == 2 and _calls(gm, aten.relu.default) == 0
    getitems = [n for n in gm.graph.nodes if n.target is operator.getitem]
    assert getitems and all("val" in n.meta for n in getitems)
    (x,) = convnet().example_inputs()
    torch.testing.assert_close(result.program.module()(x), convnet()(x))


def test_debug_counter_allows_only_the_first_rewrites(llama_ep):
    adds = _calls(llama_ep.graph_module, aten.add.Tensor)
    subs = _calls(llama_ep.graph_module, aten.sub.Tensor)
    result = apply(llama_ep, ReplaceAddWithMulSub(), debug_counter=fp.core.DebugCounter(count=2))
    gm = result.graph_module
    assert _calls(gm, aten.add.Tensor) == adds - 2
    assert _calls(gm, aten.sub.Tensor) == subs + 2
    result.program.validate()


def test_every_rewrite_is_announced():
    events = []

    class Listen(fp.core.Instrumentation):
        def on_change(self, event, ctx):
            events.append(event)

    model = build_convnet(inplace_relu=True)
    ep = torch.export.export(model, model.example_inputs())
    apply(ep, ReplaceInPlaceReluWithOutOfPlaceRelu(), instrument=[Listen()])
    assert [e.kind for e in events] == ["replace", "replace"]
    assert events[0].old[0].name == "relu_" and events[0].new[0].target is aten.relu.default


def test_graph_without_fake_values_needs_sample_inputs():
    model = convnet()
    (x,) = model.example_inputs()
    gm = torch.fx.symbolic_trace(lambda t: torch.ops.aten.add.Tensor(t, t))
    with pytest.raises(fp.PassFailedError, match="sample_inputs"):
        ReplaceAddWithMulSub()(gm)
    result = ReplaceAddWithMulSub()(gm, [x])
    torch.testing.assert_close(result.graph_module(x), x * x - x)


def test_proxy_values_and_aliases():
    seen = []

    class Look(InterpreterPass):
        def call_operator(self, op, args, kwargs, meta):
            out = super().call_operator(op, args, kwargs, meta)
            if op is aten.addmm.default:
                seen.append((args[1], out))
            return out

    Look()(convnet_ep().graph_module)
    (arg, out) = seen[0]
    assert isinstance(out, ProxyValue) and out.is_tensor()
    assert out.to_tensor().shape == (2, 10) and arg.meta["val"].shape[0] == 2
    assert ExportPass is InterpreterPass
    assert issubclass(InterpreterPass, fp.Pass)


def test_placeholder_hook_overrides_count_as_changes_and_get_attrs_copy_as_they_are():
    class Reinput(InterpreterPass):
        def placeholder(self, name, arg, meta):
            value = super().placeholder(name, arg, meta)
            return ProxyValue(value.node, value.data)  # not the input unchanged any more

    assert Reinput()(convnet_ep().graph_module).modified is True

    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("scale", torch.full((3,), 2.0))

        def forward(self, x):
            return torch.mul(x, self.scale)

    gm = torch.fx.symbolic_trace(Scaled())
    assert any(n.op == "get_attr" for n in gm.graph.nodes)
    result = fp.Pipeline([InterpreterPass()]).run(gm, [torch.ones(3)])
    assert result.modified is False and result.graph_module is gm
