"""A torch.compile backend that runs fxpass pipelines: ``torch.compile(model, backend="fxpass")``.

The name ``"fxpass"`` works without importing fxpass: the package declares it in the
``torch_dynamo_backends`` entry-point group, and Dynamo finds it there. By default it runs
the registered ``default`` pipeline on the ATen graphs Inductor compiles, then Inductor
(or the named pipelines ``FXPASS_PIPELINES`` configures, see :mod:`fxpass.targets.hooks`).
:func:`backend` configures one:

============  =========================================================================
``ir``        what the passes see
============  =========================================================================
``"aten"``    AOTAutograd's ATen graphs (forward, and backward when training), with fake
              sample inputs — Torch-TensorRT's lowering. With ``compiler="inductor"`` the
              passes run inside Inductor at ``hook`` (``post_grad_custom_pre_pass``), so
              they see exactly the graph Inductor compiles and its FX graph cache stays on.
``"dynamo"``  Dynamo's torch-level graph (``torch.nn.functional`` calls, real example
              inputs) — SGLang's NPU backend.
============  =========================================================================

``pipelines`` puts several named pipelines at once at any of the hooks of
:mod:`fxpass.targets.hooks` (Dynamo's graph, Inductor's pre-grad, joint and post-grad
hooks, AOTAutograd's graphs); each run's report says which (``report.where``).
``ranges`` compiles each graph once per range of a symbolic size and calls the right one
at run time (:mod:`fxpass.targets.dispatch`); ``cache`` keeps pipeline results on disk
(:mod:`fxpass.core.cache`). When Inductor's own cache serves a graph, its passes do not
run: the backend then adds the reports recorded when they ran, marked ``cached``.

``compiler`` is ``"inductor"``, ``"eager"`` (run the transformed graph as Python), or a
function ``(gm, example_inputs) -> callable`` (another backend). ``split_at`` (Dynamo IR)
cuts the graph at those ops first — ``"attention"`` — and compiles the pieces between them
separately, as the piecewise backends of SGLang and vLLM do.

Guards, recompilation and dynamic shapes are Dynamo's business: the backend is called once
per graph Dynamo produces, exactly as a stock backend would be.

>>> compiled = torch.compile(model, backend="fxpass")                         # doctest: +SKIP
>>> import fxpass
>>> be = fxpass.backend("remove_assert_ops,fuse_add_rmsnorm", ir="aten", compiler="eager")
>>> compiled = torch.compile(model, backend=be)                               # doctest: +SKIP
>>> be.reports[0]        # what the passes did to the first graph             # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import fx

from ..core.cache import metadata_only
from ..core.pipeline import Pipeline, resolve_pipeline
from ..core.ranges import Ranges, compile_range
from ..core.report import Report
from ..fxutil.graph_forms import spelled
from .dispatch import CompileRanges, RangeDispatch, compile_ranges, plan_ranges
from .hooks import INDUCTOR_HOOKS, PipelinesConfigError, Placement, pipelines_from_env, placements
from .inductor_cache import InductorReports
from .piecewise import _nothing_to_split, _split, split_predicate
from .runner import Runner

__all__ = ["FxpassBackend", "backend", "fxpass_backend"]

#: ``ir``: the graph form the passes see (:mod:`fxpass.fxutil.graph_forms`); ``"aten"`` is
#: the ``aot`` form, AOTAutograd's ATen graphs
IR_FORMS = spelled({"aten": "aot", "dynamo": "dynamo"})
IRS = tuple(IR_FORMS)
COMPILERS = ("inductor", "eager")
_OWN_OPTIONS = (
    "pipeline", "pipelines", "ir", "compiler", "split_at", "hook", "ranges", "dims", "cache",
)  # fmt: skip


@dataclass(frozen=True)
class _Settings:
    """How a backend compiles (see :func:`backend` for each field)."""

    pipeline: Any = None
    ir: str = "aten"
    compiler: str | Callable[..., Any] = "inductor"
    hook: str = "post_grad_custom_pre_pass"
    split_at: Any = None
    decompositions: Mapping[Any, Callable[..., Any]] | str | None = None
    instrument: tuple[Any, ...] = ()
    mode: str | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    pipelines: tuple[Placement, ...] | None = None
    ranges: CompileRanges | None = None
    cache: Any = None

    def __post_init__(self) -> None:
        if self.ir not in IRS:
            raise ValueError(f"ir must be one of {IRS} (what the passes see), not {self.ir!r}")
        if not callable(self.compiler) and self.compiler not in COMPILERS:
            raise ValueError(
                f"compiler must be one of {COMPILERS} or a function (gm, example_inputs) -> "
                f"callable, not {self.compiler!r}"
            )
        if self.hook not in INDUCTOR_HOOKS:
            raise ValueError(f"hook must be one of {INDUCTOR_HOOKS}, not {self.hook!r}")
        hooks = {p.hook for p in self.placements()}
        if self.split_at is not None and "dynamo" not in hooks:
            raise ValueError(
                "split_at cuts Dynamo's graph before AOTAutograd: use it with ir='dynamo' "
                "(the pieces are then compiled with the compiler you chose)"
            )
        inductor = self.compiler == "inductor"
        for p in self.placements():
            if p.hook in INDUCTOR_HOOKS and not inductor:
                raise PipelinesConfigError(
                    f"pipeline '{p.name}' is at {p.hook}, inside Inductor, but the compiler "
                    f"is {self.compiler!r}: use the hooks 'dynamo' or 'aot' with it"
                )
            if p.hook == "aot" and inductor:
                raise PipelinesConfigError(
                    f"pipeline '{p.name}' is at 'aot', which is for compilers other than "
                    "Inductor; with Inductor use post_grad_custom_pre_pass (the same graphs)"
                )

    def placements(self) -> tuple[Placement, ...]:
        """The pipelines and where each runs (one unnamed pipeline unless ``pipelines``)."""
        if self.pipelines is not None:
            return self.pipelines
        if self.ir == "dynamo":
            hook = "dynamo"
        else:
            hook = self.hook if self.compiler == "inductor" else "aot"
        return (Placement("pipeline", hook, self.pipeline),)


class FxpassBackend:
    """A configured torch.compile backend (made by :func:`backend`); call it like any backend.

    ``reports`` holds the report of every pipeline run (``reports_for(name)``: those of one
    named pipeline), ``compiles`` counts the graphs Dynamo handed over (one per compilation
    and recompilation), ``runners`` maps each pipeline's name to its runner, and
    ``dispatches`` holds the range dispatchers of graphs compiled per range (``.calls``:
    how many calls each range served).
    """

    __name__ = "fxpass"

    def __init__(
        self,
        settings: _Settings,
        runners: Mapping[str, Runner] | None = None,
        reports: list[Report] | None = None,
    ) -> None:
        self.settings = settings
        self.reports: list[Report] = [] if reports is None else reports
        self.runners: dict[str, Runner] = dict(runners or {}) or {
            p.name: Runner(
                None if p.pipeline is None else resolve_pipeline(p.pipeline),
                instrument=settings.instrument,
                reports=self.reports,
                cache=settings.cache,
                where={"pipeline": p.name, "hook": p.hook}
                if settings.pipelines is not None
                else {"hook": p.hook},
            )
            for p in settings.placements()
        }
        self.compiles = 0
        self.dispatches: list[RangeDispatch] = []
        self._inductor_reports = InductorReports(self.reports)

    @property
    def runner(self) -> Runner:
        """The runner of the (first) pipeline."""
        return next(iter(self.runners.values()))

    @property
    def pipeline(self) -> Pipeline:
        """The (first) pipeline as it stands now (the ``default`` one is read at each compile)."""
        return self.runner.pipeline

    def reports_for(self, name: str) -> list[Report]:
        """The reports of the pipeline called ``name``."""
        if name not in self.runners:
            raise KeyError(f"no pipeline called {name!r}; this backend has {sorted(self.runners)}")
        return [r for r in self.reports if r.where.get("pipeline", "pipeline") == name]

    def __call__(
        self,
        gm: fx.GraphModule,
        example_inputs: Sequence[Any],
        *,
        mode: str | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> Callable[..., Any]:
        self.compiles += 1
        # torch.compile(..., mode=..., options=...) reach a backend as keywords
        target = self._for_call(mode, options) if (mode or options) else self
        return target._compile(gm, list(example_inputs))

    def _for_call(self, mode: str | None, options: Mapping[str, Any] | None) -> FxpassBackend:
        """This backend with torch.compile's ``mode``/``options`` applied; same reports."""
        options = dict(options or {})
        own = {k: options.pop(k) for k in list(options) if k in _OWN_OPTIONS}
        if "pipelines" in own:
            own["pipelines"] = tuple(placements(own["pipelines"]))
        elif "pipeline" in own:
            own["pipelines"] = None
        if "dims" in own and "ranges" not in own:
            raise ValueError("the dims option says where the sizes of ranges are: give ranges too")
        if "ranges" in own:
            own["ranges"] = _as_ranges(own["ranges"], own.pop("dims", None))
        s = self.settings
        settings = replace(s, **own, mode=mode or s.mode, options={**s.options, **options})
        fresh = {"pipeline", "pipelines", "cache", "ir", "compiler", "hook"} & set(own)
        return FxpassBackend(settings, None if fresh else self.runners, self.reports)

    # ----- one graph: per compile range, then per hook ------------------------------------------
    def _compile(self, gm: fx.GraphModule, inputs: list[Any]) -> Callable[..., Any]:
        if self.settings.ranges is None:
            return self._compile_for(gm, inputs, None)
        plan = plan_ranges(self.settings.ranges, gm, inputs)
        entries = [(r, self._compile_for(_copy(gm), inputs, r)) for r in plan.combos]
        fallback = None
        if plan.fallback is not None:
            fallback = self._compile_for(_copy(gm), inputs, plan.fallback)
        if not plan.readers:  # static sizes: one compile, nothing to choose at run time
            return entries[0][1]
        dispatch = RangeDispatch(plan.readers, entries, fallback)
        self.dispatches.append(dispatch)
        return dispatch

    def _compile_for(self, gm: fx.GraphModule, inputs: list[Any], ranges: Ranges | None):
        scope = compile_range(ranges) if ranges else contextlib.nullcontext()
        with scope:
            if self.settings.split_at is not None:
                return self._compile_pieces(gm, inputs, ranges)
            gm = self._run_dynamo(gm, inputs)
            return self._after_dynamo(gm, inputs, ranges)

    def _at(self, hook: str) -> list[Runner]:
        return [self.runners[p.name] for p in self.settings.placements() if p.hook == hook]

    def _run_dynamo(self, gm: fx.GraphModule, inputs: Sequence[Any]) -> fx.GraphModule:
        key_inputs = _state_only(gm, inputs)
        for runner in self._at("dynamo"):
            gm = runner.run(gm, inputs, key_inputs=key_inputs).graph_module
        return gm

    def _after_dynamo(self, gm: fx.GraphModule, inputs: list[Any], ranges: Ranges | None):
        if self.settings.compiler == "inductor":
            return self._compile_inductor(gm, inputs, ranges)
        if self._at("aot"):
            return self._compile_aot(gm, inputs, ranges)
        if self.settings.compiler == "eager":
            return gm.forward
        return self.settings.compiler(gm, inputs)

    def _compile_pieces(self, gm: fx.GraphModule, inputs: list[Any], ranges: Ranges | None):
        is_split = split_predicate(self.settings.split_at)
        pieces = _split(gm, is_split)
        if pieces is None:
            ends = [*gm.graph.find_nodes(op="placeholder"), *gm.graph.find_nodes(op="output")]
            if any(map(is_split, ends)):  # a predicate that only the inputs/output satisfy
                raise _nothing_to_split(self.settings.split_at)
            # a graph without the op (e.g. after a graph break): nothing to cut
            return self._after_dynamo(self._run_dynamo(gm, inputs), inputs, ranges)
        for runner in self._at("dynamo"):
            done = len(pieces.reports)
            pieces.run(runner.pipeline, instrument=self.settings.instrument)
            for report in pieces.reports[done:]:
                report.where.update(runner.where)
        self.reports.extend(pieces.reports)
        if self.settings.compiler != "eager" or self._at("aot"):
            pieces.compile(lambda piece, fake: self._after_dynamo(piece, fake, ranges))
        return pieces.module.forward

    def _compile_inductor(self, gm: fx.GraphModule, inputs: list[Any], ranges: Ranges | None):
        from torch._inductor.compile_fx import compile_fx

        patches = self._inductor_patches()
        installed = self._inductor_reports.install(
            patches, {h: self._at(h) for h in INDUCTOR_HOOKS}, ranges
        )
        if not installed:
            return compile_fx(gm, inputs, config_patches=patches)
        with self._inductor_reports.compiling(gm, inputs, installed, ranges, self._placed()):
            return compile_fx(gm, inputs, config_patches=patches)

    def _placed(self) -> list[tuple[Runner, str]]:
        return [(self.runners[p.name], p.hook) for p in self.settings.placements()
                if p.hook in INDUCTOR_HOOKS]  # fmt: skip

    def _compile_aot(self, gm: fx.GraphModule, inputs: list[Any], ranges: Ranges | None):
        from functorch.compile import min_cut_rematerialization_partition
        from torch._dynamo.backends.common import aot_autograd

        def compiler(graph: str) -> Callable[..., Any]:
            return functools.partial(_aot_compile, self, ranges, graph)

        return aot_autograd(
            fw_compiler=compiler("forward"),
            bw_compiler=compiler("backward"),
            inference_compiler=compiler("inference"),
            partition_fn=min_cut_rematerialization_partition,
            keep_inference_input_mutations=True,
            decompositions=_decompositions(self.settings.decompositions),
        )(gm, inputs)

    def _inductor_patches(self) -> dict[str, Any]:
        patches: dict[str, Any] = {}
        if self.settings.mode is not None and self.settings.mode != "default":
            patches.update(torch._inductor.list_mode_options(self.settings.mode))
        patches.update(self.settings.options)
        return patches

    def __repr__(self) -> str:
        s = self.settings
        compiler = s.compiler if isinstance(s.compiler, str) else "custom"
        split = f", split_at={s.split_at!r}" if s.split_at is not None else ""
        ranges = f", ranges={str(s.ranges)!r}" if s.ranges is not None else ""
        if s.pipelines is not None:
            named = ", ".join(f"{p.name}@{p.hook}" for p in s.pipelines)
            return f"fxpass.backend(pipelines=[{named}], compiler={compiler!r}{split}{ranges})"
        return (
            f"fxpass.backend({str(self.pipeline)!r}, ir={s.ir!r}, compiler={compiler!r}"
            f"{split}{ranges})"
        )


def _copy(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy of Dynamo's graph for one compile range (compiling may edit the graph)."""
    import copy

    new = fx.GraphModule(gm, copy.deepcopy(gm.graph))
    new.meta = dict(gm.meta)
    return new


def _state_only(gm: fx.GraphModule, inputs: Sequence[Any]) -> list[Any]:
    """The example inputs as the cache key sees them: parameters and buffers by content,
    the call's own arguments (any values of the same shape compile the same) by metadata."""
    out = list(inputs)
    for i, node in enumerate(gm.graph.find_nodes(op="placeholder")):
        if i >= len(out):
            break
        grapharg = node.meta.get("grapharg")
        source = getattr(getattr(grapharg, "source", None), "name", "")
        source = source() if callable(source) else str(source)
        if not (isinstance(out[i], torch.nn.Parameter) or "_buffers[" in source):
            out[i] = metadata_only([out[i]])[0]
    return out


def _aot_compile(
    be: FxpassBackend, ranges: Ranges | None, graph: str, gm: fx.GraphModule, inputs: Sequence[Any]
):
    # the backward graph compiles at the first backward, after the compile that set the range
    with compile_range(ranges) if ranges else contextlib.nullcontext():
        for runner in be._at("aot"):
            gm = runner.run(gm, inputs, where={"graph": graph}).graph_module
    if be.settings.compiler == "eager":
        from torch._dynamo.backends.debugging import boxed_nop

        return boxed_nop(gm, list(inputs))
    return be.settings.compiler(gm, list(inputs))


def _decompositions(decompositions: Any) -> Any:
    if decompositions == "core_aten":
        return torch._decomp.core_aten_decompositions()
    if isinstance(decompositions, str):
        raise ValueError(f"decompositions is 'core_aten', a table or None, not {decompositions!r}")
    return decompositions


def _as_ranges(ranges: Any, dims: Any) -> CompileRanges | None:
    if ranges is None or isinstance(ranges, CompileRanges):
        return ranges
    return compile_ranges(ranges, dims)


def backend(
    pipeline: Any = None,
    ir: str = "aten",
    compiler: str | Callable[..., Any] = "inductor",
    *,
    hook: str = "post_grad_custom_pre_pass",
    pipelines: Any = None,
    ranges: Mapping[str, Sequence[Any]] | CompileRanges | None = None,
    dims: Mapping[str, tuple[str, int]] | None = None,
    cache: Any = None,
    split_at: Any = None,
    decompositions: Mapping[Any, Callable[..., Any]] | str | None = None,
    instrument: Iterable[Any] = (),
    mode: str | None = None,
    options: Mapping[str, Any] | None = None,
) -> FxpassBackend:
    """A torch.compile backend running ``pipeline`` (default: the ``default`` pipeline).

    Args:
        pipeline: a Pipeline, spec string, pass or list of passes; None reads the
            ``default`` pass list at every compile (or, when ``FXPASS_PIPELINES`` is set
            and ``pipelines`` is not given, runs the pipelines it names).
        ir: ``"aten"`` (AOTAutograd ATen graphs with fake sample inputs) or ``"dynamo"``
            (Dynamo's torch-level graph with real example inputs).
        compiler: ``"inductor"``, ``"eager"``, or a function ``(gm, example_inputs)``
            returning a callable.
        hook: with ``ir="aten"`` and Inductor, the Inductor hook the passes run at.
        pipelines: several named pipelines at once, each at its hook (instead of
            ``pipeline``/``ir``/``hook``): ``{hook: pipeline}``, ``Placement`` objects,
            ``(name, hook, pipeline)`` triples or a config file (:mod:`fxpass.targets.hooks`).
        ranges: compile each graph once per range of a symbolic size, e.g.
            ``{"tokens": [(1, 512), (513, None)]}``; ``dims`` says where each size is,
            ``{"tokens": ("ids", 1)}`` (:mod:`fxpass.targets.dispatch`).
        cache: a folder (or :class:`~fxpass.core.cache.PipelineCache`) that keeps pipeline
            results: a later compile of the same graph restores them without the passes.
        split_at: with ``ir="dynamo"``, ops to cut the graph at (e.g. ``"attention"``);
            the pipeline and the compiler then work piece by piece.
        decompositions: for ``ir="aten"`` without Inductor: ``"core_aten"``, a table, or
            None (AOTAutograd's own).
        instrument: instrumentation attached to every run.
        mode, options: Inductor's ``mode`` and config ``options``, as for
            ``torch.compile(backend="inductor")``.
    """
    if pipelines is not None and pipeline is not None:
        raise ValueError("give either pipeline (one pipeline) or pipelines (named ones), not both")
    if pipelines is None and pipeline is None:
        named = pipelines_from_env()
    else:
        named = placements(pipelines) if pipelines is not None else None
    if dims is not None and ranges is None:
        raise ValueError("dims says where the sizes of ranges are: give ranges too")
    settings = _Settings(
        pipeline,
        ir,
        compiler,
        hook,
        split_at,
        decompositions,
        tuple(instrument),
        mode,
        dict(options or {}),
        tuple(named) if named is not None else None,
        _as_ranges(ranges, dims),
        cache,
    )
    return FxpassBackend(settings)


_DEFAULT: FxpassBackend | None = None


def fxpass_backend(
    gm: fx.GraphModule,
    example_inputs: Sequence[Any],
    *,
    mode: str | None = None,
    options: Mapping[str, Any] | None = None,
) -> Callable[..., Any]:
    """The ``"fxpass"`` backend: the ``default`` pipeline on Inductor's ATen graphs, then
    Inductor (or the pipelines ``FXPASS_PIPELINES`` names). ``torch.compile(...,
    options={"pipeline": "...", "ir": "dynamo", "compiler": "eager"})`` configures it;
    other options go to Inductor."""
    return default_backend()(gm, example_inputs, mode=mode, options=options)


def default_backend() -> FxpassBackend:
    """The backend behind ``backend="fxpass"`` (its ``reports`` and ``compiles``)."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = backend()
    return _DEFAULT
