"""ExportedProgram in, ExportedProgram out: run passes without breaking the graph signature.

An ``ExportedProgram`` is a graph plus a contract about it: every placeholder is a parameter,
buffer, constant, token or user input (``input_specs``, in placeholder order); every output
is a user output or the new value of a mutated buffer (``output_specs``); parameters and
buffers live in ``state_dict``, lifted constants in ``constants``. A pass that edits the
graph by hand breaks that contract. :func:`run_on_program` runs a pipeline on a *copy* of
the program's graph and then reconciles the contract with what the passes did:

* a tensor a pass added as a ``get_attr`` constant (:func:`add_constant`, or any
  ``gm.register_buffer`` + ``graph.get_attr``) becomes a lifted ``CONSTANT_TENSOR`` input,
  with its value in ``constants``;
* a parameter, buffer or constant input a pass erased (it had no users left, e.g. after
  folding) leaves the signature, and ``state_dict`` / ``constants`` drop its value;
* a user input a pass erased is put back (unused), so the program is still called with the
  same arguments; the report notes it;
* a mutation output a pass erased (:func:`erase_mutation`, or by editing the output node)
  leaves ``output_specs``; the buffer is simply no longer written;
* placeholders and outputs a pass renamed or replaced keep their specs.

The user's program is never edited: the result is a new ``ExportedProgram`` (or the same
object when nothing changed), built with ``ExportedProgram``'s own constructor, which
validates it. A pass that fails leaves nothing behind.

Passes reach the program they run on through their context, ``PassContext.program`` (a
:class:`ProgramContext`: its parameters' values, which placeholder is which), so they never
need to touch a spec; a pass that is not handed its context (a user's function pass) reads
the same object with :func:`program_context`. The new program is built by
:mod:`fxpass.targets.programs`, the one place an ExportedProgram is built.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import fx
from torch.export import ExportedProgram
from torch.export.graph_signature import (
    ConstantArgument,
    ExportGraphSignature,
    InputKind,
    InputSpec,
    OutputKind,
    OutputSpec,
    TensorArgument,
)

from ..core.context import scoped
from ..core.errors import FxpassError
from ..edit.editor import Editor
from ..fxutil.fx_internals import (
    EXPORTED_META,
    copy_sharing_specs,
    last_node,
    lazy_exported_programs,
    make_lazy_module,
)
from ..fxutil.paths import del_path, find_path
from .programs import updated_program
from .pt2 import load as _load_pt2
from .runner import Runner

__all__ = [
    "ProgramContext",
    "SignatureError",
    "add_constant",
    "erase_mutation",
    "load",
    "program_context",
    "run_on_program",
    "save",
    "value_of",
]

_MUTATIONS = (
    OutputKind.TOKEN,
    OutputKind.BUFFER_MUTATION,
    OutputKind.PARAMETER_MUTATION,
    OutputKind.USER_INPUT_MUTATION,
)


class SignatureError(FxpassError):
    """The passes left a graph that no ExportedProgram signature can describe."""


@dataclass
class _OutSlot:
    spec: OutputSpec
    node: Any  # the output value when the slot was last known to be right
    name: str | None


@dataclass
class ProgramContext:
    """What a pass running on an ExportedProgram's graph may know about the program.

    ``input_spec(node)`` says what a placeholder is, ``value(node)`` gives the tensor
    behind a parameter, buffer or constant placeholder. Reach it from a pass with
    :func:`program_context`.
    """

    program: ExportedProgram
    state_dict: dict[str, Any]
    constants: dict[str, Any]
    outputs: list[_OutSlot]
    notes: list[str] = field(default_factory=list)
    _inputs: dict[str, InputSpec] = field(default_factory=dict)

    @property
    def signature(self) -> ExportGraphSignature:
        """The signature of the program as it was before the passes."""
        return self.program.graph_signature

    def input_spec(self, node: fx.Node | str) -> InputSpec | None:
        """The input spec of a placeholder (by node or name), None for other nodes."""
        name = node if isinstance(node, str) else node.name
        if not isinstance(node, str) and node.op != "placeholder":
            return None
        return self._inputs.get(name)

    def value(self, node: fx.Node | str) -> torch.Tensor | None:
        """The tensor behind a parameter, buffer or constant placeholder; None otherwise."""
        spec = self.input_spec(node)
        if spec is None or spec.target is None:
            return None
        if spec.target in self.state_dict:
            return self.state_dict[spec.target]
        return self.constants.get(spec.target)

    def mutation_outputs(self) -> dict[str, int]:
        """Mutated target (buffer, parameter, user input) -> its position in the outputs."""
        return {
            s.spec.target: i
            for i, s in enumerate(self.outputs)
            if s.spec.kind in _MUTATIONS and s.spec.target is not None
        }


_ACTIVE: contextvars.ContextVar[ProgramContext | None] = contextvars.ContextVar(
    "fxpass_program", default=None
)


def program_context() -> ProgramContext | None:
    """The ExportedProgram the passes now running belong to (None for a plain GraphModule).

    >>> ctx = program_context()                       # doctest: +SKIP
    >>> if ctx is not None and ctx.input_spec(node).kind == InputKind.PARAMETER:  # doctest: +SKIP
    ...     weight = ctx.value(node)                  # the real tensor
    """
    return _ACTIVE.get()


def _activate(ctx: ProgramContext) -> contextlib.AbstractContextManager[ProgramContext]:
    return scoped(_ACTIVE, ctx)


# ----- helpers for passes --------------------------------------------------------------------
def _owner(gm_or_graph: fx.GraphModule | fx.Graph) -> fx.GraphModule:
    if isinstance(gm_or_graph, fx.GraphModule):
        return gm_or_graph
    gm = getattr(gm_or_graph, "owning_module", None)
    if not isinstance(gm, fx.GraphModule):
        raise TypeError(
            "add_constant needs a GraphModule (or a Graph that belongs to one) to hold the "
            f"tensor, got {type(gm_or_graph).__name__}"
        )
    return gm


def _fake_mode(graph: fx.Graph) -> Any:
    from torch._guards import detect_fake_mode

    vals = [n.meta["val"] for n in graph.nodes if n.op == "placeholder" and "val" in n.meta]
    return detect_fake_mode(vals) if vals else None


def _fake_of(graph: fx.Graph, tensor: torch.Tensor) -> Any:
    """A fake tensor for ``tensor`` in the graph's fake mode (a fresh mode if it has none)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = _fake_mode(graph) or FakeTensorMode(allow_non_fake_inputs=True)
    return mode.from_tensor(tensor, static_shapes=True)


def _attr_name(gm: fx.GraphModule, name: str) -> str:
    base = re.sub(r"\W", "_", name).strip("_") or "constant"
    if base[0].isdigit():
        base = "_" + base
    candidate, i = base, 0
    while hasattr(gm, candidate):
        i += 1
        candidate = f"{base}_{i}"
    return candidate


def add_constant(
    gm: fx.GraphModule | fx.Graph,
    name: str,
    tensor: torch.Tensor,
    *,
    origin: Sequence[fx.Node] = (),
    editor: Editor | None = None,
) -> fx.Node:
    """Add ``tensor`` to the module as a constant and return a ``get_attr`` node reading it.

    The node is placed after the placeholders (so it comes before every use) and gets
    ``meta["val"]``; it is inserted through ``editor`` (a pass's ``ctx.editor``; default: the
    run in progress's, ``Editor.current()``), so the run is told,
    with ``origin`` — the nodes the constant was computed from, e.g. the ``permute`` of a
    weight it folds — as its provenance (``from_node``). In a plain GraphModule it stays a
    ``get_attr``; when the passes run on an ExportedProgram it becomes a lifted
    ``CONSTANT_TENSOR`` input with its value in ``program.constants`` — a pass never edits a
    spec.

    >>> w = add_constant(gm, "folded_weight", weight.t().contiguous(), origin=[t])  # doctest: +SKIP
    >>> editor.replace_input(node, t, w, rule="fold")                              # doctest: +SKIP
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"add_constant takes a tensor, got {type(tensor).__name__}")
    module = _owner(gm)
    graph = module.graph
    attr = _attr_name(module, name)
    value = tensor.detach()
    module.register_buffer(attr, value, persistent=False)
    first = next((n for n in graph.nodes if n.op != "placeholder"), None)
    where = {"before": first} if first is not None else {"after": last_node(graph)}
    editor = editor if editor is not None else Editor.current()
    val = _fake_of(graph, value)
    if origin:
        return editor.insert(
            attr, op="get_attr", rule="add_constant", origin=origin, val=val, **where
        )
    at = graph.inserting_before(first) if first is not None else graph.inserting_after()
    with editor.change("insert", "add_constant"), at:
        node = editor.create(graph, "get_attr", attr)  # made from nothing: no provenance
    node.meta["val"] = val
    return node


def value_of(gm: fx.GraphModule, node: fx.Node) -> torch.Tensor | None:
    """The tensor a node stands for when it is a constant: a ``get_attr`` of a tensor, or a
    parameter / buffer / constant placeholder of the ExportedProgram being transformed."""
    if node.op == "get_attr":
        obj = find_path(gm, str(node.target))
        return obj if isinstance(obj, torch.Tensor) else None
    if node.op == "placeholder":
        ctx = program_context()
        return ctx.value(node) if ctx is not None else None
    return None


def erase_mutation(gm: fx.GraphModule, target: str, *, editor: Editor | None = None) -> bool:
    """Stop writing back the mutated buffer / parameter / user input ``target``.

    Removes its value from the graph's outputs (the computation stays until dead-code
    elimination removes it); returns False when ``target`` is not mutated. Only meaningful
    while passes run on an ExportedProgram. ``editor`` as for :func:`add_constant`.
    """
    ctx = program_context()
    if ctx is None:
        raise RuntimeError(
            "erase_mutation only works on an ExportedProgram's graph: run the pass with "
            "fxpass.apply(exported_program, ...)"
        )
    where = ctx.mutation_outputs().get(target)
    if where is None:
        return False
    out = gm.graph.output_node()
    values = list(out.args[0])
    if len(values) != len(ctx.outputs):
        raise SignatureError(
            "erase_mutation: the graph's outputs no longer line up with the program's "
            f"output specs ({len(values)} outputs, {len(ctx.outputs)} specs)"
        )
    del values[where]
    del ctx.outputs[where]
    editor = editor if editor is not None else Editor.current()
    editor.set_args(out, (type(out.args[0])(values), *out.args[1:]), rule="erase_mutation")
    return True


# ----- running ---------------------------------------------------------------------------------
def _copy_module(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy of ``gm`` with its own graph (node meta copied shallowly), sharing tensors;
    its code is generated only if something runs it (the passes work on the graph)."""
    new = make_lazy_module(gm, copy_sharing_specs(gm.graph))
    new.meta = dict(gm.meta)
    for name, child in list(new.named_children()):
        if isinstance(child, fx.GraphModule):  # e.g. branches of cond: passes may edit them
            setattr(new, name, _copy_module(child))
    return new


def _graph_inputs(ep: ExportedProgram, user_inputs: Sequence[Any] | None) -> list[Any] | None:
    """One value per placeholder: parameters, buffers and constants, then the user inputs."""
    from ..verify.inputs import program_inputs

    if user_inputs is not None:
        return program_inputs(ep, user_inputs, strict=False)
    if ep.example_inputs is None:
        return None
    return program_inputs(ep, *ep.example_inputs, strict=False)


def run_on_program(
    ep: ExportedProgram,
    runner: Runner,
    sample_inputs: Sequence[Any] | None = None,
    *,
    debug_counter: Any = None,
) -> tuple[ExportedProgram, Any]:
    """Run ``runner``'s pipeline on a copy of ``ep``'s graph; return ``(new_program,
    pass_result)``.

    ``sample_inputs`` are the program's user inputs (default: ``ep.example_inputs``);
    lowering passes ``(gm, sample_inputs)`` get one value per graph placeholder.
    """
    sig = ep.graph_signature
    work = _copy_module(ep.graph_module)
    out_values = list(work.graph.output_node().args[0])
    ctx = ProgramContext(
        program=ep,
        state_dict=dict(ep.state_dict),
        constants=dict(ep.constants),
        outputs=[
            _OutSlot(spec, v, v.name if isinstance(v, fx.Node) else None)
            for spec, v in zip(sig.output_specs, out_values)
        ],
        _inputs={s.arg.name: s for s in sig.input_specs if hasattr(s.arg, "name")},
    )
    work.meta[EXPORTED_META] = True  # e.g. partition then calls submodules as export does
    try:
        with _activate(ctx):
            result = runner.run(work, _graph_inputs(ep, sample_inputs),
                                debug_counter=debug_counter, program=ctx)  # fmt: skip
    finally:
        work.meta.pop(EXPORTED_META, None)
    if not result.modified:
        return ep, result
    try:
        program = _rebuild(ep, ctx, result.graph_module)
    except SignatureError as e:
        e.report = result.report
        raise
    if result.report is not None:
        result.report.root.notes.extend(ctx.notes)
    return program, result


# ----- reconciling the signature ---------------------------------------------------------------
def _rebuild(ep: ExportedProgram, ctx: ProgramContext, gm: fx.GraphModule) -> ExportedProgram:
    graph = gm.graph
    # the run is over: these edits make the graph fit a signature again, and no run watches
    editor = Editor(None, "export")
    new_constants = _lift_constants(gm, ctx, editor)
    input_specs = _reconcile_inputs(ep, ctx, graph, new_constants, editor)
    output_specs = _reconcile_outputs(ctx, graph)
    signature = ExportGraphSignature(input_specs=input_specs, output_specs=output_specs)
    _drop_unused_state(ctx, input_specs)
    graph.lint()
    _fill_missing_vals(gm)
    try:
        with lazy_exported_programs():  # code generated when the program is run or saved
            program = updated_program(ep, gm, signature, ctx.state_dict, ctx.constants)
    except Exception as e:
        raise SignatureError(
            f"after the passes the graph no longer forms a valid ExportedProgram: "
            f"{type(e).__name__}: {e}"
        ) from e
    program.graph_module.meta.update(ep.graph_module.meta)
    return program


def _fill_missing_vals(gm: fx.GraphModule) -> None:
    """Give ``meta["val"]`` to nodes a pass made without one (the verifier needs it): run
    each such op on the fake values of its inputs."""
    from ..fxutil.values import fake_value

    mode = _fake_mode(gm.graph)
    if mode is None:
        return
    for node in gm.graph.nodes:
        if node.op != "call_function" or "val" in node.meta:
            continue
        try:
            node.meta["val"] = fake_value(
                node.target, node.args, node.kwargs, mode=mode, strict=True
            )
        except Exception as e:
            raise SignatureError(
                f"node '{node.name}' ({node.target}) has no meta['val'] and running it on fake "
                f"inputs failed: {type(e).__name__}: {e}; set node.meta['val'] in the pass"
            ) from e


def _lift_constants(gm: fx.GraphModule, ctx: ProgramContext, editor: Editor) -> list[InputSpec]:
    """Turn ``get_attr`` nodes of tensors into lifted CONSTANT_TENSOR placeholders."""
    graph = gm.graph
    taken = set(ctx.state_dict) | set(ctx.constants)
    first_user = next(
        (
            n
            for n in graph.nodes
            if n.op != "placeholder"
            or getattr(ctx.input_spec(n), "kind", None) == InputKind.USER_INPUT
        ),
        None,
    )
    lifted: dict[str, fx.Node] = {}
    specs: list[InputSpec] = []
    for node in list(graph.nodes):
        if node.op != "get_attr":
            continue
        value = value_of(gm, node)
        if value is None:
            continue  # a submodule (e.g. a cond branch): stays a get_attr
        target = str(node.target)
        if target not in lifted:
            fqn, i = target, 0
            while fqn in taken:
                i += 1
                fqn = f"{target}_{i}"
            taken.add(fqn)
            ph = editor.insert(
                "c_" + re.sub(r"\W", "_", fqn),
                op="placeholder",
                rule="lift_constant",
                origin=[node],
                before=first_user,
            )
            editor.set_target(ph, ph.name, rule="lift_constant")
            ph.meta.update(node.meta)
            if "val" not in ph.meta:
                ph.meta["val"] = _fake_of(graph, value)
            ctx.constants[fqn] = value
            specs.append(InputSpec(InputKind.CONSTANT_TENSOR, TensorArgument(ph.name), fqn))
            lifted[target] = ph
            ctx.notes.append(f"lifted constant '{fqn}' (input '{ph.name}')")
        editor.replace_all_uses(node, lifted[target], "lift_constant")
    for target in lifted:
        del_path(gm, target)
    return specs


def _reconcile_inputs(ep, ctx, graph: fx.Graph, new_constants: list[InputSpec], editor: Editor):
    by_name = {s.arg.name: s for s in new_constants}
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    others: list[tuple[fx.Node, InputSpec]] = []
    user: dict[str, fx.Node] = {}
    for node in placeholders:
        spec = by_name.get(node.name) or ctx.input_spec(node.name)
        if spec is None:
            raise SignatureError(
                f"a pass added the graph input '{node.name}', but an ExportedProgram's "
                "inputs are fixed; add tensors with fxpass.targets.export.add_constant"
            )
        if spec.kind == InputKind.USER_INPUT:
            user[node.name] = node
        else:
            others.append((node, spec))
    anchor = next((n for n in graph.nodes if n.op != "placeholder"), None)
    ordered: list[tuple[fx.Node, InputSpec]] = list(others)
    for spec in ep.graph_signature.input_specs:
        if spec.kind != InputKind.USER_INPUT:
            continue
        node = user.get(spec.arg.name)
        if node is None:  # a pass erased it: the program still takes the argument
            node = _restore_placeholder(ep, graph, spec, anchor, editor)
            ctx.notes.append(f"kept user input '{spec.arg.name}' (a pass erased it; unused)")
        ordered.append((node, spec))
    if anchor is not None:
        for node, _ in ordered:
            editor.move(node, before=anchor, rule="signature")
    return [_renamed_input(spec, node) for node, spec in ordered]


def _restore_placeholder(ep, graph: fx.Graph, spec: InputSpec, anchor, editor) -> fx.Node:
    old = next(n for n in ep.graph.nodes if n.op == "placeholder" and n.name == spec.arg.name)
    where = {"before": anchor} if anchor is not None else {"after": last_node(graph)}
    node = editor.insert(old.name, op="placeholder", rule="signature", origin=[old], **where)
    if node.name != old.name and all(n.name != old.name for n in graph.nodes):
        editor.rename(node, old.name, rule="signature")  # the erased placeholder's name
    editor.set_target(node, old.target, rule="signature")
    node.meta.update(old.meta)
    return node


def _renamed_input(spec: InputSpec, node: fx.Node) -> InputSpec:
    arg = spec.arg
    if hasattr(arg, "name") and arg.name != node.name and not isinstance(arg, ConstantArgument):
        arg = dataclasses.replace(arg, name=node.name)
    return InputSpec(spec.kind, arg, spec.target, spec.persistent)


def _reconcile_outputs(ctx: ProgramContext, graph: fx.Graph) -> list[OutputSpec]:
    values = list(graph.output_node().args[0])
    slots = ctx.outputs
    if len(values) == len(slots):
        pairs = list(zip(slots, values))
    else:
        tail = [s for s in slots if s.spec.kind not in _MUTATIONS]
        head = [s for s in slots if s.spec.kind in _MUTATIONS]
        if len(values) < len(tail):
            raise SignatureError(
                f"a pass removed a user output: the program returns {len(tail)} values but "
                f"the graph now has {len(values)} outputs"
            )
        split = len(values) - len(tail)
        pairs = [(_match(head, v), v) for v in values[:split]]
        pairs += list(zip(tail, values[split:]))
        erased = [s.spec.target for s in head if all(s is not p[0] for p in pairs)]
        for target in erased:
            ctx.notes.append(f"erased the write-back of mutated '{target}'")
    specs = []
    for slot, value in pairs:
        arg = slot.spec.arg
        if isinstance(value, fx.Node):
            if not isinstance(arg, ConstantArgument) and arg.name != value.name:
                arg = dataclasses.replace(arg, name=value.name)
        elif not isinstance(arg, ConstantArgument):
            arg = ConstantArgument(name="", value=value)
        specs.append(OutputSpec(slot.spec.kind, arg, slot.spec.target))
    return specs


def _match(head: list[_OutSlot], value: Any) -> _OutSlot:
    for s in head:
        if s.node is value:
            return s
    name = getattr(value, "name", None)
    for s in head:
        if name is not None and s.name == name:
            return s
    raise SignatureError(
        f"a pass changed the mutation outputs of the program so that output '{name or value}' "
        "matches no buffer, parameter or input; erase write-backs with "
        "fxpass.targets.export.erase_mutation"
    )


def _drop_unused_state(ctx: ProgramContext, input_specs: list[InputSpec]) -> None:
    used = {s.target for s in input_specs if s.target is not None}
    for store in (ctx.state_dict, ctx.constants):
        for key in [k for k in store if k not in used]:
            if any(s.target == key for s in ctx.signature.input_specs):
                del store[key]
                ctx.notes.append(f"dropped '{key}' (its input was removed)")


# ----- files -----------------------------------------------------------------------------------
def save(program: ExportedProgram, path: str | Path) -> Path:
    """Save ``program`` as a ``.pt2`` file (``torch.export.save``); returns the path."""
    path = Path(path)
    torch.export.save(program, str(path))
    return path


def load(path: str | Path, *, imports: Sequence[str] = ()) -> ExportedProgram:
    """Load a ``.pt2`` file as ``torch.export.load`` does, but checked and without running
    code: see :func:`fxpass.targets.pt2.load` (``imports``: modules to import first, e.g.
    ``["transformers"]``). fxpass's fused ops are registered, so programs using them load."""
    return _load_pt2(path, imports=imports)
