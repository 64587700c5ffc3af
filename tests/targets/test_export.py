import pytest
import torch
from _target_models import (
    aten,
    convnet,
    convnet_ep,
    fold_param_permute,
    graph_state,
    remove_unused_inputs,
)
from torch.export.graph_signature import InputKind

import fxpass as fp
from fxpass.models.convnet import build_convnet
from fxpass.targets.apply import apply
from fxpass.targets.export import (
    ProgramContext,
    SignatureError,
    add_constant,
    erase_mutation,
    load,
    program_context,
    save,
    value_of,
)

import _models


def _check(ep, reference, inputs):
    """The program validates and computes what ``reference`` (a module) computes."""
    ep.validate()
    torch.testing.assert_close(ep.module()(*inputs), reference(*inputs))


def test_folded_weight_becomes_a_constant_and_its_input_goes(tmp_path):
    ep = convnet_ep()
    before = graph_state(ep)
    model, inputs = convnet(), convnet().example_inputs()
    result = apply(ep, [fold_param_permute, remove_unused_inputs])
    new = result.program
    assert result.modified and isinstance(new, torch.export.ExportedProgram)
    _check(new, model, inputs)
    sig = new.graph_signature
    assert "fc.weight" not in new.state_dict and "fc.weight" not in sig.parameters
    [(_, target)] = sig.inputs_to_lifted_tensor_constants.items()
    torch.testing.assert_close(new.constants[target], model.fc.weight.detach().t())
    assert _models.count(new.graph_module, aten.permute.default) == 0
    # unused BN counters were erased too, and their state with them
    assert not any("num_batches_tracked" in k for k in new.state_dict)
    assert graph_state(ep) == before, "the user's program must not change"
    loaded = load(save(new, tmp_path / "folded.pt2"))
    _check(loaded, model, inputs)
    assert sorted(loaded.constants) == sorted(new.constants)


def test_llama_weights_fold_and_program_still_matches():
    ep = _models.exported(layers=1)
    (ids,) = _models.decoder(layers=1).example_inputs()
    result = apply(ep, [fold_param_permute, remove_unused_inputs])
    new = result.program
    _check(new, ep.module(), (ids,))  # bf16: compare with the program, not eager
    assert len(new.graph_signature.inputs_to_lifted_tensor_constants) == 8  # 7 linears + lm_head
    assert len(new.graph_signature.parameters) == len(ep.graph_signature.parameters) - 8


def test_erase_buffer_mutation_keeps_the_other_write_backs():
    ep = convnet_ep(train=True)
    model = build_convnet(train=True)

    def keep_batch_counters_fixed(gm):
        ctx = program_context()
        targets = [t for t in ctx.mutation_outputs() if t.endswith("num_batches_tracked")]
        return any([erase_mutation(gm, t) for t in targets])

    new = apply(ep, keep_batch_counters_fixed).program
    new.validate()
    mutated = set(new.graph_signature.buffers_to_mutate.values())
    assert mutated == {f"blocks.{i}.bn.running_{s}" for i in (0, 1) for s in ("mean", "var")}
    module = new.module()
    (x,) = model.example_inputs()
    torch.testing.assert_close(module(x), model(x))  # model's own buffers update too
    bn = module.get_submodule("blocks.0.bn")
    torch.testing.assert_close(bn.running_mean, model.blocks[0].bn.running_mean)
    assert int(bn.num_batches_tracked) == 0 and int(model.blocks[0].bn.num_batches_tracked) == 1


def test_mutation_erased_by_editing_the_output_node_directly():
    ep = convnet_ep(train=True)

    def drop_first_write_back(gm):
        out = gm.graph.output_node()
        out.args = (tuple(out.args[0][1:]),)
        return True

    new = apply(ep, drop_first_write_back).program
    new.validate()
    assert "blocks.0.bn.running_mean" not in new.graph_signature.buffers_to_mutate.values()
    assert len(new.graph_signature.buffers_to_mutate) == 5


class _TwoInputs(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = convnet()

    def forward(self, x, unused):
        return self.net(x)


def test_erased_user_input_is_kept_so_the_call_is_unchanged():
    model = _TwoInputs()
    inputs = (convnet().example_inputs()[0], torch.ones(3))
    ep = torch.export.export(model, inputs)
    result = apply(ep, remove_unused_inputs)
    new = result.program
    assert new.graph_signature.user_inputs == ep.graph_signature.user_inputs
    _check(new, model, inputs)
    assert any("kept user input 'unused'" in n for n in result.report.root.notes)


def test_failing_pass_leaves_the_program_intact():
    ep = convnet_ep()
    before = graph_state(ep)

    def half_then_fail(gm):
        fold_param_permute(gm)
        raise RuntimeError("boom")

    with pytest.raises(fp.PassFailedError, match="boom"):
        apply(ep, half_then_fail)
    assert graph_state(ep) == before
    _check(ep, convnet(), convnet().example_inputs())


def test_added_graph_input_is_a_clear_error_and_program_intact():
    ep = convnet_ep()
    before = graph_state(ep)

    def add_input(gm):
        first = next(iter(gm.graph.nodes))
        with gm.graph.inserting_before(first):
            gm.graph.placeholder("extra")
        return True

    with pytest.raises(SignatureError, match="added the graph input 'extra'"):
        apply(ep, add_input)
    assert graph_state(ep) == before


def test_removed_user_output_is_a_clear_error():
    ep = convnet_ep()

    def drop_output(gm):
        gm.graph.output_node().args = ((),)
        return True

    with pytest.raises(SignatureError, match="removed a user output"):
        apply(ep, drop_output)


def test_node_without_fake_value_that_cannot_run_is_a_clear_error():
    ep = convnet_ep()
    before = graph_state(ep)

    def add_bad_mm(gm):  # mm of a 4-d input with itself: fails on fake tensors too
        x = next(n for n in gm.graph.nodes if n.op == "placeholder" and n.name == "x")
        out = gm.graph.output_node()
        with gm.graph.inserting_before(out):
            gm.graph.call_function(aten.mm.default, (x, x))
        return True

    with pytest.raises(SignatureError, match=r"has no meta\['val'\] and running it on fake"):
        apply(ep, add_bad_mm)
    assert graph_state(ep) == before


def test_unchanged_program_is_returned_as_is():
    ep = convnet_ep()
    result = apply(ep, lambda gm: False)
    assert result.program is ep and not result.modified


def test_program_context_knows_every_placeholder():
    ep = convnet_ep()
    seen = {}

    def look(gm):
        ctx = program_context()
        assert isinstance(ctx, ProgramContext)
        for n in gm.graph.nodes:
            if n.op == "placeholder":
                seen[n.name] = (ctx.input_spec(n).kind, ctx.value(n))
        return False

    apply(ep, look)
    kind, value = seen["p_fc_weight"]
    assert kind == InputKind.PARAMETER and value is ep.state_dict["fc.weight"]
    assert seen["x"] == (InputKind.USER_INPUT, None)
    assert program_context() is None  # only while passes run


def test_add_constant_in_a_plain_graph_module_stays_a_get_attr():
    gm = convnet_ep().module()
    gm = torch.fx.symbolic_trace(convnet())
    node = add_constant(gm, "my const", torch.ones(2))
    assert node.op == "get_attr" and value_of(gm, node).sum() == 2
    assert node.meta["val"].shape == (2,)
    assert all(
        n.op == "placeholder" for n in list(gm.graph.nodes)[: list(gm.graph.nodes).index(node)]
    )
    with pytest.raises(TypeError, match="takes a tensor"):
        add_constant(gm, "x", 1.0)


def test_add_constant_is_an_insert_the_run_sees_with_the_provenance_of_its_origin():
    gm = torch.fx.symbolic_trace(convnet())
    seen = []

    class Changes(fp.core.Instrumentation):
        def on_change(self, event, ctx):
            seen.append(event)

    def add_one(gm):
        origin = next(n for n in gm.graph.nodes if n.op == "call_module")
        add_constant(gm, "made_from", torch.ones(2), origin=[origin])
        add_constant(gm, "from_nothing", torch.ones(2))
        return True

    fp.Pipeline([add_one]).run(gm, instrument=[Changes()])
    attrs = {n.target: n for n in gm.graph.nodes if n.op == "get_attr"}
    made, nothing = attrs["made_from"], attrs["from_nothing"]
    assert [e.kind for e in seen] == ["insert", "insert"] and seen[1].new == [nothing]
    assert made.meta["from_node"][0].pass_name == "add_one" and "from_node" not in nothing.meta


def test_erase_mutation_outside_a_program_says_how():
    with pytest.raises(RuntimeError, match=r"fxpass.apply\(exported_program"):
        erase_mutation(torch.fx.symbolic_trace(convnet()), "x")


def test_sample_inputs_reach_lowering_passes_one_per_placeholder():
    ep = convnet_ep()
    got = []

    def lowering(gm, sample_inputs):
        got.append(list(sample_inputs))
        return gm

    apply(ep, lowering)
    placeholders = [n for n in ep.graph.nodes if n.op == "placeholder"]
    assert len(got[0]) == len(placeholders)
    assert got[0][-1] is ep.example_inputs[0][0]
    assert got[0][0] is ep.state_dict["blocks.0.conv.weight"]


def test_given_sample_inputs_are_the_user_inputs_and_none_is_missing_ones():
    from fxpass.verify.inputs import program_inputs

    ep = convnet_ep()
    got = []

    def lowering(gm, sample_inputs):
        got.append(list(sample_inputs))
        return gm

    (x,) = ep.example_inputs[0]
    apply(ep, lowering, [x])
    apply(ep, lowering, [])  # too few: the placeholder gets None, nothing fails
    assert got[0][-1] is x and got[0] == program_inputs(ep, [x])
    assert got[1][-1] is None and got[1][:-1] == got[0][:-1]


def test_nodes_made_without_fake_values_get_them():
    from _target_models import rsqrt_to_reciprocal_sqrt

    ep = _models.exported(layers=1, dtype=torch.float32)
    (ids,) = _models.decoder(layers=1, dtype=torch.float32).example_inputs()
    new = apply(ep, rsqrt_to_reciprocal_sqrt).program  # its new nodes carry no meta["val"]
    new.validate()
    for node in new.graph_module.graph.nodes:
        if node.target in (aten.sqrt.default, aten.reciprocal.default):
            assert node.meta["val"].dtype == torch.float32
    torch.testing.assert_close(new.module()(ids), ep.module()(ids))
