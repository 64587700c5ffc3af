"""fxpass.compat.executorch against ExecuTorch's originals: the same passes, written once,
run through ``executorch.exir.pass_base.ExportPass`` and ``fxpass.compat.executorch.ExportPass``
must build the same graphs with the same metadata and raise the same errors."""

from __future__ import annotations

import copy
import operator

import pytest
import torch

pytest.importorskip("executorch.exir")

import executorch.exir.pass_base as et
import executorch.exir.pass_manager as et_pm
from _executorch_helpers import AddRelu, edge_manager, edge_program, graph_difference, inputs, run
from executorch.exir.dialects._ops import ops as exir_ops
from executorch.exir.error import ExportError
from torch.fx.passes.infra.pass_base import PassResult as TorchPassResult

import fxpass as fp
from fxpass.compat import executorch as compat
from fxpass.models.convnet import build_convnet

aten = torch.ops.aten
edge = exir_ops.edge.aten
BASES = {"executorch": et.ExportPass, "fxpass": compat.ExportPass}


# ----- the seed's passes, written once against either base ------------------------------------
def replace_inplace_relu(base):
    class ReplaceInPlaceReluWithOutOfPlaceReluPass(base):
        def call_operator(self, op, args, kwargs, meta):
            if op != aten.relu_.default:
                return super().call_operator(op, args, kwargs, meta)
            return super().call_operator(aten.relu.default, args, kwargs, meta)

    return ReplaceInPlaceReluWithOutOfPlaceReluPass


def replace_add_with_mul_sub(base, add=aten.add.Tensor, mul=aten.mul.Tensor, sub=aten.sub.Tensor):
    class ReplaceAddWithMulSub(base):
        def call_operator(self, op, args, kwargs, meta):
            if op != add:
                return super().call_operator(op, args, kwargs, meta)
            _, y = args
            mul_res = super().call_operator(mul, args, {}, meta)
            return super().call_operator(sub, (mul_res, y), {}, meta)

    return ReplaceAddWithMulSub


def edge_add_with_mul_sub(base):
    return replace_add_with_mul_sub(base, edge.add.Tensor, edge.mul.Tensor, edge.sub.Tensor)


def remove_detach(base):
    class RemoveDetachPass(base):
        def call_operator(self, op, args, kwargs, meta):
            if op not in (aten.detach.default, aten.detach_copy.default):
                return super().call_operator(op, args, kwargs, meta)
            assert len(args) == 1
            return args[0]

    return RemoveDetachPass


def scalar_to_tensor(base):
    map_args = et.map_args if base is et.ExportPass else compat.map_args

    class ScalarToTensorPass(base):
        def call_operator(self, op, args, kwargs, meta):
            def try_coerce(value, arg):
                return (
                    torch.tensor(value)
                    if isinstance(value, (float, int, bool)) and type(arg.type) is torch.TensorType
                    else value
                )

            if isinstance(op, torch._ops.OpOverload):
                args, kwargs = map_args(op, try_coerce, args, kwargs)
            return super().call_operator(op, args, kwargs, meta)

    return ScalarToTensorPass


class _Detached(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = build_convnet()

    def forward(self, x):
        return self.net(x).detach()


def _both(make, gm):
    """Run the pass ``make(base)`` through both bases, each on its own copy of ``gm`` (fake
    tensor mode remembers how it converted a tensor: a second run on the same tensors can
    differ from the first, in ExecuTorch too)."""
    return {name: make(base)()(copy.deepcopy(gm)) for name, base in BASES.items()}


def _same(results, *args):
    ours, theirs = results["fxpass"].graph_module, results["executorch"].graph_module
    assert graph_difference(theirs, ours) is None, graph_difference(theirs, ours)
    if args:
        torch.testing.assert_close(ours(*args), theirs(*args), rtol=0, atol=0, equal_nan=True)


@pytest.fixture(scope="module")
def convnet_inplace():
    net = build_convnet(inplace_relu=True).eval()
    (image,) = net.example_inputs()
    return torch.export.export(net, (image,)).module(), image


def test_one_to_one_relu_on_a_module_with_parameters(convnet_inplace):
    gm, image = convnet_inplace
    results = _both(replace_inplace_relu, gm)
    _same(results, image)
    new = results["fxpass"].graph_module
    assert not any(n.target is aten.relu_.default for n in new.graph.nodes)
    # parameters read with get_attr come back as ExecuTorch names them, where they are used
    assert any(
        n.op == "get_attr" and n.target.startswith("_param_constant") for n in new.graph.nodes
    )


def test_one_to_x_add_on_an_exported_module():
    gm = torch.export.export(AddRelu(), inputs("add_relu")).module(check_guards=False)
    _same(_both(replace_add_with_mul_sub, gm), *inputs("add_relu"))


def test_one_to_none_detach():
    model = _Detached().eval()
    (image,) = model.net.example_inputs()
    gm = torch.export.export(model, (image,)).module(check_guards=False)
    results = _both(remove_detach, gm)
    _same(results, image)
    assert not any(
        n.target is aten.detach.default for n in results["fxpass"].graph_module.graph.nodes
    )


class _Scalars(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.linear(x * 2.0 + 1.0).clamp(min=0.0)


def test_scalars_to_tensors_become_constants():
    x = torch.randn(4, 8)
    gm = torch.export.export(_Scalars(), (x,)).module(check_guards=False)
    results = _both(scalar_to_tensor, gm)
    _same(results, x)
    names = [n.target for n in results["fxpass"].graph_module.graph.nodes if n.op == "get_attr"]
    assert any(name.startswith("_tensor_constant") for name in names)


@pytest.mark.parametrize("name", ["add_relu", "constant", "dynamic", "cond"])
@pytest.mark.parametrize(
    "make", [lambda base: base, edge_add_with_mul_sub], ids=["identity", "add"]
)
def test_edge_programs_give_the_same_graphs(name, make):
    ep = edge_program(name)
    results = _both(make, ep.graph_module)
    _same(results)
    ours, theirs = results["fxpass"].graph_module, results["executorch"].graph_module
    args = inputs(name)
    torch.testing.assert_close(run(ep, ours, *args), run(ep, theirs, *args), equal_nan=True)


def test_a_pass_inside_cond_branches():
    class AddToSubInBranches(compat.ExportPass):
        def call_operator(self, op, args, kwargs, meta):
            if op == edge.add.Tensor:
                return super().call_operator(edge.sub.Tensor, args, kwargs, meta)
            return super().call_operator(op, args, kwargs, meta)

    ep = edge_program("cond")
    new = AddToSubInBranches()(ep.graph_module).graph_module
    branches = [m for name, m in new.named_children() if name.startswith("submodule")]
    assert len(branches) == 2
    ops = [n.target for b in branches for n in b.graph.nodes if n.op == "call_function"]
    assert edge.sub.Tensor in ops and edge.add.Tensor not in ops


def test_symbolic_inputs_are_preserved_and_checked():
    ep = edge_program("dynamic")

    def collapse(base):
        class CollapseSymbolicInputPass(base):
            def placeholder(self, name, arg, meta):
                proxy = super().placeholder(name, arg, meta)
                if any(isinstance(dim, torch.SymInt) for dim in arg.shape):
                    proxy.node.meta["val"] = torch.empty(2, 3, 4, device="meta")
                return proxy

        return CollapseSymbolicInputPass

    errors = {}
    for name, base in BASES.items():
        with pytest.raises(et.ExportPassBaseError) as info:
            collapse(base)()(copy.deepcopy(ep.graph_module))
        errors[name] = str(info.value)
    assert errors["fxpass"] == errors["executorch"]
    assert "did not preserve symbolic metadata across pass replay" in errors["fxpass"]


def test_symbolic_proxy_values_refuse_python_scalars():
    ep = edge_program("dynamic")
    size = next(n for n in ep.graph.nodes if isinstance(n.meta.get("val"), torch.SymInt))
    value = compat.ProxyValue(size.meta["val"], size)
    assert isinstance(value, et.ProxyValue)
    for convert, message in ((bool, "boolean context"), (int, "converted to int")):
        with pytest.raises(compat.ExportPassBaseError, match=message):
            convert(value)


def test_the_same_errors():
    gm = edge_program("add_relu").graph_module

    class NotInitialized(compat.ExportPass):
        def __init__(self):
            pass

    with pytest.raises(et.ExportPassBaseError, match="not initialized with __init__"):
        NotInitialized()(gm)

    def add_input(base):
        class AddInput(base):
            def placeholder(self, name, arg, meta):
                if name == "y":
                    super().placeholder("extra", arg, copy.copy(meta))
                return super().placeholder(name, arg, meta)

        return AddInput

    messages = set()
    for base in BASES.values():
        with pytest.raises(ExportError) as info:
            add_input(base)()(copy.deepcopy(gm))
        messages.add(str(info.value))
    assert len(messages) == 1 and "changing the placeholders" in messages.pop()


def test_a_failing_pass_leaves_the_module_as_it_was():
    gm = edge_program("add_relu").graph_module
    code = gm.code

    class Boom(compat.ExportPass):
        def call_operator(self, op, args, kwargs, meta):
            if op == edge.relu.default:
                args[0].node.graph.owning_module  # noqa: B018 - touch the new graph first
                raise ValueError("unsupported")
            return super().call_operator(op, args, kwargs, meta)

    with pytest.raises(ValueError, match="unsupported") as info:
        Boom()(gm)
    assert "While executing" in str(info.value)  # torch's interpreter context, as ExecuTorch
    assert gm.code == code


def test_unchanged_programs_are_not_rebuilt():
    gm = edge_program("add_relu").graph_module
    theirs = et.ExportPass()(gm)
    ours = compat.ExportPass()(gm)
    assert theirs.modified and theirs.graph_module is not gm
    assert not ours.modified and ours.graph_module is gm
    assert isinstance(ours, TorchPassResult)
    assert isinstance(compat.ExportPass(), et.ExportPass)  # for ExecuTorch's own checks


def test_only_new_nodes_run_on_fake_tensors():
    """What makes it fast: nodes a pass leaves alone keep their fake values."""
    ep = edge_program("add_relu")
    ran = []

    class Counting(
        replace_add_with_mul_sub(
            compat.ExportPass, edge.add.Tensor, edge.mul.Tensor, edge.sub.Tensor
        )
    ):
        def _run(self, kind, target, args, kwargs):
            ran.append(target)
            return super()._run(kind, target, args, kwargs)

    new = Counting()(ep.graph_module).graph_module
    assert [t for t in ran if t != "output"] == [edge.mul.Tensor, edge.sub.Tensor] * 2
    relu = next(n for n in new.graph.nodes if n.target == edge.relu.default)
    old = next(n for n in ep.graph.nodes if n.target == edge.relu.default)
    assert relu.meta["val"] is old.meta["val"]


def test_hooks_get_executorch_objects():
    seen = {}

    class Look(compat.ExportPass):
        def call_operator(self, op, args, kwargs, meta):
            seen.setdefault("meta", meta)
            seen.setdefault("arg", args[0])
            return super().call_operator(op, args, kwargs, meta)

        def call_getitem(self, value, key, meta):
            seen["getitem"] = key
            return super().call_getitem(value, key, meta)

    Look()(edge_program("add_relu").graph_module)
    assert isinstance(seen["meta"], et.NodeMetadata)
    with pytest.raises(RuntimeError, match="Could not override node key: val"):
        seen["meta"]["val"] = None
    assert isinstance(seen["arg"], et.ProxyValue) and isinstance(seen["arg"].proxy, torch.fx.Proxy)


# ----- pass managers ------------------------------------------------------------------------
def _introduce_call_method(gm):
    node = list(gm.graph.nodes)[-2]
    with gm.graph.inserting_after(node):
        gm.graph.call_method("relu", (node,))
    return TorchPassResult(gm, True)


@pytest.mark.parametrize("managers", [(et_pm.PassManager, compat.PassManager)], ids=["graph"])
def test_pass_managers_raise_the_same_errors(managers):
    messages = []
    for manager in managers:
        gm = copy.deepcopy(edge_program("add_relu").graph_module)
        with pytest.raises(Exception, match="An error occurred when running") as info:
            manager(passes=[_introduce_call_method], run_checks_after_each_pass=True)(gm)
        messages.append((str(info.value), str(info.value.__cause__)))
    assert messages[0] == messages[1]
    assert "call_method" in messages[1][1] and "backend delegate" in messages[1][1]


def test_program_manager_updates_signature_and_constants_like_executorch():
    class DoubleConstants(compat.ExportedProgramPassBase):
        def call(self, ep):
            for key, const in ep.constants.items():
                ep.constants[key] = const * 2
            return compat.ExportedProgramPassResult(ep, True)

    results = {}
    for name, manager, base in (
        ("executorch", et_pm.ExportedProgramPassManager, et.ExportPass),
        ("fxpass", compat.ExportedProgramPassManager, compat.ExportPass),
    ):
        ep = edge_program("constant")
        passes = [edge_add_with_mul_sub(base)(), DoubleConstants()]
        results[name] = manager(passes, run_checks_after_each_pass=True)(ep)
    ours, theirs = results["fxpass"].exported_program, results["executorch"].exported_program
    assert graph_difference(theirs.graph_module, ours.graph_module) is None
    assert ours.graph_signature == theirs.graph_signature
    assert all(torch.equal(ours.constants[k], theirs.constants[k]) for k in theirs.constants)
    (x,) = inputs("constant")
    torch.testing.assert_close(ours.module()(x), theirs.module()(x))


def test_program_manager_puts_everything_back_when_a_pass_fails():
    ep = edge_program("constant")
    code, constants = ep.graph_module.code, {k: v.clone() for k, v in ep.constants.items()}

    class Corrupt(compat.ExportedProgramPassBase):
        def call(self, program):
            for key in program.constants:
                program.constants[key] = program.constants[key] * 0
            raise RuntimeError("half done")

    manager = compat.ExportedProgramPassManager(
        [edge_add_with_mul_sub(compat.ExportPass)(), Corrupt()]
    )
    with pytest.raises(
        Exception, match="'Corrupt' pass after the following passes: \\['ReplaceAddWithMulSub'\\]"
    ):
        manager(ep)
    assert ep.graph_module.code == code
    assert all(torch.equal(ep.constants[k], v) for k, v in constants.items())


def test_program_manager_in_executorch_transform():
    new = edge_manager("add_relu").transform([edge_add_with_mul_sub(compat.ExportPass)()])
    targets = [n.target for n in new.exported_program().graph.nodes if n.op == "call_function"]
    assert edge.add.Tensor not in targets and edge.sub.Tensor in targets
    x, y = inputs("add_relu")
    r = torch.relu(x * y - y)
    torch.testing.assert_close(new.exported_program().module()(x, y), r * y - y)


def test_compat_passes_run_in_fxpass_pipelines():
    ep = edge_program("add_relu")
    result = fp.apply(ep, fp.Pipeline([edge_add_with_mul_sub(compat.ExportPass)(), "dce"]))
    assert result.modified
    assert result.report.root.children[0].stats == {"rewritten": 2}
    assert operator.getitem not in [n.target for n in result.graph_module.graph.nodes]


def test_debug_counters_and_instrumentation_see_each_rewrite():
    ep = edge_program("add_relu")

    class Changes(fp.Instrumentation):
        def __init__(self):
            self.events = []

        def on_change(self, event, ctx):
            self.events.append([n.name for n in event.old])

    watch = Changes()
    result = fp.apply(
        ep,
        edge_add_with_mul_sub(compat.ExportPass)(),
        debug_counter=fp.DebugCounter(count=1),
        instrument=[watch],
    )
    assert watch.events == [["aten_add_tensor"]]
    targets = [n.target for n in result.graph_module.graph.nodes]
    assert targets.count(edge.add.Tensor) == 1 and targets.count(edge.sub.Tensor) == 1


def test_unchanged_graphs_get_the_metadata_executorchs_rebuild_gives():
    gm = edge_program("add_relu").graph_module
    for node in gm.graph.nodes:
        node.meta.pop("tensor_meta", None)
    out = gm.graph.output_node()
    out.meta.pop("val", None)
    theirs = et.ExportPass()(copy.deepcopy(gm)).graph_module
    ours = compat.ExportPass()(gm)
    assert not ours.modified and ours.graph_module is gm
    assert graph_difference(theirs, gm) is None  # val and tensor_meta included
    vals = out.meta["val"]
    compat.ExportPass()(gm)
    assert out.meta["val"] is vals  # settled once: the same objects the next time


def test_a_pass_says_whether_it_modified_the_graph_as_executorch_returns_it():
    class RebuildsAndSaysNo(edge_add_with_mul_sub(compat.ExportPass)):
        def call(self, graph_module):
            return TorchPassResult(super().call(graph_module).graph_module, False)

    gm = edge_program("add_relu").graph_module
    result = RebuildsAndSaysNo()(gm)
    assert result.graph_module is not gm and not result.modified


def test_a_manager_called_inside_a_pass_is_a_run_of_its_own():
    """ExecuTorch's passes call to_edge (and so managers) on other programs from inside a
    pass: that run must not join the outer one's checks, nor lose its own report."""
    outer_checks = []

    def check(gm):
        outer_checks.append(len(gm.graph.nodes))

    def lowers_another_program(gm):
        inner = compat.ExportedProgramPassManager([edge_add_with_mul_sub(compat.ExportPass)()])
        result = inner(edge_program("add_relu"))
        assert result.modified and inner.report is not None
        return False

    gm = edge_program("constant").graph_module
    pipeline = fp.Pipeline(
        [lowers_another_program], checks=[check], run_checks_after_each_pass=True
    )
    pipeline.run(gm)
    assert outer_checks == [len(gm.graph.nodes)]  # only after the outer pass, on its graph
