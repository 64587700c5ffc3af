"""Multi-stream schedules the tests share: the embedded decoders and two tiny Hugging Face
GQA MoE decoders (Mixtral, Qwen3-MoE), scheduled once per session, handed out as fresh
copies, with the inputs their graphs take.

The Hugging Face models repeat their keys and values for grouped-query attention the way
every GQA model does (``expand`` then ``reshape``: a reshape that copies), which is what
the embedded decoder (``repeat_interleave``) does not exercise.
"""

from __future__ import annotations

import copy
import functools

import pytest
import torch

import fxpass as fp
from fxpass.verify.inputs import program_inputs

import _models

#: The three models of the streams work: plain, MoE (shared + routed experts), parallel block.
MODELS = {
    "decoder": {},
    "moe": {"moe_experts": 4},
    "parallel": {"parallel_block": True},
}
#: Tiny GQA MoE decoders from Hugging Face configs (random weights, nothing downloaded).
HF_MODELS = ("mixtral", "qwen3_moe")
SPEC = "multi_stream{streams=2}"


@functools.cache
def _original(name: str) -> tuple[torch.fx.GraphModule, tuple]:
    if name in HF_MODELS:
        ep = _hf_exported(name)
        gm = fp.apply(copy.deepcopy(ep), "remove_assert_ops").program.graph_module
        return gm, tuple(program_inputs(ep, *ep.example_inputs[0]))
    ep = _models.exported(**MODELS[name])
    gm = _models.exported_gm(remove_asserts=True, **MODELS[name])
    return gm, tuple(program_inputs(ep, *ep.example_inputs))


@functools.cache
def _hf_exported(name: str) -> torch.export.ExportedProgram:
    transformers = pytest.importorskip("transformers")
    import _hf

    if name == "qwen3_moe":
        return _hf.exported("qwen3_moe")
    common = _hf.config("mistral").to_dict()  # the tests' small shape, 2 of 4 heads for k/v
    for key in ("architectures", "model_type", "transformers_version"):
        common.pop(key, None)
    cfg = transformers.MixtralConfig(**common, num_local_experts=4, num_experts_per_tok=2)
    cfg._attn_implementation = "sdpa"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    return torch.export.export(model, _hf.example_inputs(), strict=False)


@functools.cache
def _scheduled(name: str, spec: str) -> tuple[torch.fx.GraphModule, fp.PassResult]:
    gm = copy.deepcopy(_original(name)[0])
    result = fp.Pipeline.parse(spec).run(gm)
    return gm, result


def original(name: str) -> tuple[torch.fx.GraphModule, list]:
    """A fresh copy of model ``name``'s exported graph (asserts removed) and its inputs."""
    gm, inputs = _original(name)
    return copy.deepcopy(gm), list(inputs)


def scheduled(name: str, spec: str = SPEC):
    """A fresh copy of model ``name`` after ``spec``, and the run's PassResult."""
    gm, result = _scheduled(name, spec)
    return copy.deepcopy(gm), result


# ----- planted faults ------------------------------------------------------------------------
OPS = torch.ops.fxpass
#: The faults a schedule can be broken by, each undone by a correct scheduler.
FAULTS = ("wait_removed", "record_too_early", "copy_past_record", "record_stream_dropped")


def _stream_nodes(gm: torch.fx.GraphModule, op) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target is op]


def _copy_then_record(gm: torch.fx.GraphModule) -> list[tuple[torch.fx.Node, torch.fx.Node]]:
    """(copying view on a side stream, the record of its stream right after it)."""
    from fxpass.edit.alias import node_memory

    out = []
    for node in gm.graph.nodes:
        if node_memory(node).kind == "copy" and node.meta.get("stream"):
            nxt = node.next
            if nxt.target is OPS.record_event.default and nxt.args[1] == node.meta["stream"]:
                out.append((node, nxt))
    return out


def fault_sites(gm: torch.fx.GraphModule, kind: str) -> int:
    """How many places ``kind`` can be planted at in ``gm``."""
    if kind == "wait_removed":
        return len(_stream_nodes(gm, OPS.wait_event.default))
    if kind == "record_too_early":
        return len(_early_records(gm))
    if kind == "copy_past_record":
        return len(_copy_then_record(gm))
    return len(_stream_nodes(gm, OPS.record_stream.default))


def _early_records(gm) -> list[tuple[torch.fx.Node, torch.fx.Node]]:
    """(record, the kernel of its stream right before it) for records made after a kernel."""
    from fxpass.edit.alias import is_kernel

    out = []
    for rec in _stream_nodes(gm, OPS.record_event.default):
        prev = rec.prev
        if is_kernel(prev) and prev.meta.get("stream") == rec.args[1]:
            out.append((rec, prev))
    return out


def plant(gm: torch.fx.GraphModule, kind: str, index: int = 0) -> str:
    """Break ``gm``'s schedule at site ``index`` of ``kind`` (a test plants faults with raw
    graph edits on purpose: they are what a buggy pass would do); returns what it did."""
    if kind == "wait_removed":
        node = _stream_nodes(gm, OPS.wait_event.default)[index]
        what = f"removed {node.name} {node.args}"
        gm.graph.erase_node(node)
    elif kind == "record_too_early":
        rec, prev = _early_records(gm)[index]
        prev.prepend(rec)
        what = f"moved {rec.name} before {prev.name}"
    elif kind == "copy_past_record":
        copy_, rec = _copy_then_record(gm)[index]
        copy_.prepend(rec)
        what = f"moved {rec.name} before the copying {copy_.name}"
    else:
        node = _stream_nodes(gm, OPS.record_stream.default)[index]
        what = f"removed {node.name} {node.args}"
        gm.graph.erase_node(node)
    gm.recompile()
    return what


def same(got, want) -> bool:
    """Outputs equal, bit for bit (NaN where the reference has a number differs)."""
    got = got if isinstance(got, (list, tuple)) else (got,)
    want = want if isinstance(want, (list, tuple)) else (want,)
    return len(got) == len(want) and all(torch.equal(g, w) for g, w in zip(got, want))


# ----- issue 19: a reshape of an expand copies -------------------------------------------------
class RepeatKvRace(torch.nn.Module):
    """The schedule multi_stream built for GQA attention before issue 19 was fixed: the side
    stream's event is recorded right after ``add``, then ``reshape(expand)`` — a copy, since
    the expand has stride 0 — runs on the side stream, and attention on the main stream
    reads it after waiting for that (too early) event."""

    def __init__(self, fixed: bool = False) -> None:
        super().__init__()
        self.fixed = fixed

    def forward(self, q, k, v):
        OPS.record_event(0, 0)
        OPS.set_stream(1)
        OPS.wait_event(0, 1)
        add = k * 0.5 + 1.0
        if not self.fixed:
            OPS.record_event(1, 1)
        expand = add[:, :, None].expand(2, 2, 2, 8, 16)
        repeated = expand.reshape(2, 4, 8, 16)  # GQA's repeat_kv
        if self.fixed:
            OPS.record_event(1, 1)
        OPS.set_stream(0)
        OPS.wait_event(1, 0)
        out = torch.nn.functional.scaled_dot_product_attention(q, repeated, v)
        OPS.record_stream(repeated, 0)
        return out


def repeat_kv_race(fixed: bool = False) -> tuple[torch.fx.GraphModule, tuple]:
    """The issue-19 schedule (or, ``fixed``, the same with the record after the copy),
    exported, and its inputs."""
    g = torch.Generator().manual_seed(0)
    inputs = (
        torch.randn(2, 4, 8, 16, generator=g),
        torch.randn(2, 2, 8, 16, generator=g),
        torch.randn(2, 4, 8, 16, generator=g),
    )
    return torch.export.export(RepeatKvRace(fixed), inputs).graph_module, inputs


# ----- random graphs over broadcast and transposed layouts -------------------------------------
aten = torch.ops.aten
#: Input layouts: dense, transposed, and broadcast (stride 0, as an ``expand`` makes them).
LAYOUTS = {
    "contiguous": lambda g: torch.randn(4, 4, generator=g),
    "transposed": lambda g: torch.randn(4, 4, generator=g).t(),
    "broadcast_rows": lambda g: torch.randn(4, 1, generator=g).expand(4, 4),
    "broadcast_cols": lambda g: torch.randn(1, 4, generator=g).expand(4, 4),
}


def _emit(graph: torch.fx.Graph, op: str, x, y):
    """One step of a random program on 4x4 values; returns the value it makes."""
    call = graph.call_function
    if op in ("add", "mul", "mm"):
        target = {"add": aten.add.Tensor, "mul": aten.mul.Tensor, "mm": aten.mm.default}[op]
        return call(target, (x, y))
    if op == "sin":
        return call(aten.sin.default, (x,))
    if op == "t":  # a view
        return call(aten.t.default, (x,))
    if op == "reshape":  # copies unless x is dense row-major
        return call(aten.reshape.default, (call(aten.reshape.default, (x, [2, 8])), [4, 4]))
    if op == "flatten":
        return call(aten.reshape.default, (call(aten.flatten.using_ints, (x,)), [4, 4]))
    if op == "contiguous":
        return call(aten.contiguous.default, (x,))
    if op == "expand":  # a stride-0 view made inside the graph
        return call(aten.expand.default, (call(aten.slice.Tensor, (x, 1, 0, 1)), [4, 4]))
    # an in-place write into memory the program made itself
    fresh = call(aten.clone.default, (x,))
    call(aten.add_.Tensor, (fresh, y))
    return fresh


OPS_ = ("add", "mul", "mm", "sin", "t", "reshape", "flatten", "contiguous", "expand", "add_")


def random_dag(draw, st, *, streams: int = 3):
    """A random graph (with ``meta['val']`` from fake tensors, and a random stream per
    node in ``meta['stream']``) and real inputs: hypothesis draws it with ``draw``."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    layouts = draw(st.lists(st.sampled_from(sorted(LAYOUTS)), min_size=1, max_size=3))
    graph = torch.fx.Graph()
    values = [graph.placeholder(f"x{i}") for i in range(len(layouts))]
    for _ in range(draw(st.integers(2, 9))):
        op = draw(st.sampled_from(OPS_))
        x, y = (values[draw(st.integers(0, len(values) - 1))] for _ in range(2))
        values.append(_emit(graph, op, x, y))
    sinks = [v for v in values if not v.users and v.op != "placeholder"]
    graph.output(tuple(sinks or values[-1:]))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    inputs = [LAYOUTS[name](gen) for name in layouts]
    FakeTensorProp(gm, FakeTensorMode()).propagate(*inputs)
    for node in gm.graph.nodes:
        if node.op == "call_function":
            node.meta["stream"] = draw(st.integers(0, streams - 1))
    return gm, inputs


def hand_schedule(draw, st, gm: torch.fx.GraphModule) -> None:
    """Schedule ``gm`` by chance, the way a careless person or tool might: a set_stream
    before each kernel that changes stream, records after some kernels, waits for some
    (recorded or not) events before others, and maybe no way back to stream 0."""
    from fxpass.edit.alias import is_kernel

    current, events = 0, 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or not is_kernel(node):
            continue
        stream = node.meta["stream"]
        with gm.graph.inserting_before(node):
            if stream != current:
                gm.graph.call_function(OPS.set_stream.default, (stream,))
                current = stream
            if events and draw(st.booleans()):
                event = draw(st.integers(0, events))  # == events: never recorded
                gm.graph.call_function(OPS.wait_event.default, (event, stream))
        if draw(st.booleans()):
            with gm.graph.inserting_after(node):
                gm.graph.call_function(OPS.record_event.default, (events, stream))
            events += 1
    output = next(n for n in gm.graph.nodes if n.op == "output")
    with gm.graph.inserting_before(output):
        if current and draw(st.booleans()):
            gm.graph.call_function(OPS.set_stream.default, (0,))
        for event in range(events):
            if draw(st.booleans()):
                gm.graph.call_function(OPS.wait_event.default, (event, 0))
    gm.recompile()
