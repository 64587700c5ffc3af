"""A torch.compile backend that runs fxpass pipelines: ``torch.compile(model, backend="fxpass")``.

The name ``"fxpass"`` works without importing fxpass: the package declares it in the
``torch_dynamo_backends`` entry-point group, and Dynamo finds it there. By default it runs
the registered ``default`` pipeline on the ATen graphs Inductor compiles, then Inductor.
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

``compiler`` is ``"inductor"``, ``"eager"`` (run the transformed graph as Python), or a
function ``(gm, example_inputs) -> callable`` (another backend). ``split_at`` (Dynamo IR)
cuts the graph at those ops first — ``"attention"`` — and compiles the pieces between them
separately, as the piecewise backends of SGLang and vLLM do.

Guards, recompilation and dynamic shapes are Dynamo's business: the backend is called once
per graph Dynamo produces, exactly as a stock backend would be.

>>> compiled = torch.compile(model, backend="fxpass")                         # doctest: +SKIP
>>> be = fxpass.backend("remove_assert_ops,fuse_add_rmsnorm", ir="aten", compiler="eager")
>>> compiled = torch.compile(model, backend=be)                               # doctest: +SKIP
>>> be.reports[0]        # what the passes did to the first graph             # doctest: +SKIP
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import fx

from ..core.pipeline import Pipeline, instrumented
from ..core.report import Report
from .apply import resolve_pipeline
from .inductor import HOOKS, InductorPass

__all__ = ["FxpassBackend", "backend", "fxpass_backend"]

IRS = ("aten", "dynamo")
COMPILERS = ("inductor", "eager")
_OWN_OPTIONS = ("pipeline", "ir", "compiler", "split_at", "hook")


class FxpassBackend:
    """A configured torch.compile backend (see :func:`backend`); call it like any backend.

    ``reports`` holds the report of every pipeline run, ``compiles`` counts the graphs
    Dynamo handed over (one per compilation and recompilation).
    """

    __name__ = "fxpass"

    def __init__(
        self,
        pipeline: Any = None,
        *,
        ir: str = "aten",
        compiler: str | Callable[..., Any] = "inductor",
        hook: str = "post_grad_custom_pre_pass",
        split_at: Any = None,
        decompositions: Mapping[Any, Callable[..., Any]] | str | None = None,
        instrument: Iterable[Any] = (),
        mode: str | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        if ir not in IRS:
            raise ValueError(f"ir must be one of {IRS} (what the passes see), not {ir!r}")
        if not callable(compiler) and compiler not in COMPILERS:
            raise ValueError(
                f"compiler must be one of {COMPILERS} or a function (gm, example_inputs) -> "
                f"callable, not {compiler!r}"
            )
        if split_at is not None and ir != "dynamo":
            raise ValueError(
                "split_at cuts Dynamo's graph before AOTAutograd: use it with ir='dynamo' "
                "(the pieces are then compiled with the compiler you chose)"
            )
        if hook not in HOOKS:
            raise ValueError(f"hook must be one of {HOOKS}, not {hook!r}")
        self._pipeline = pipeline
        self._parsed: dict[str, Pipeline] = {}  # the pipeline given, parsed once (shared)
        self.ir = ir
        self.compiler = compiler
        self.hook = hook
        self.split_at = split_at
        self.decompositions = decompositions
        self.instrument = tuple(instrument)
        self.mode = mode
        self.options = dict(options or {})
        self.reports: list[Report] = []
        self.compiles = 0

    @property
    def pipeline(self) -> Pipeline:
        """The pipeline as it stands now (the ``default`` one is read at each compile)."""
        if self._pipeline is None:
            return resolve_pipeline(None)
        parsed = self._parsed.get("pipeline")
        if parsed is None:
            parsed = self._parsed["pipeline"] = resolve_pipeline(self._pipeline)
        return parsed

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
        target = self._configured(mode, options) if (mode or options) else self
        return target._compile(gm, list(example_inputs))

    def _compile(self, gm: fx.GraphModule, inputs: list[Any]) -> Callable[..., Any]:
        if self.ir == "dynamo":
            return self._compile_dynamo(gm, inputs)
        if self.compiler == "inductor":
            return self._compile_inductor_hook(gm, inputs)
        return self._compile_aot(gm, inputs)

    def _configured(self, mode: str | None, options: Mapping[str, Any] | None) -> FxpassBackend:
        """This backend with torch.compile's ``mode``/``options`` applied; same reports."""
        options = dict(options or {})
        own = {k: options.pop(k) for k in list(options) if k in _OWN_OPTIONS}
        configured = FxpassBackend(
            own.get("pipeline", self._pipeline),
            ir=own.get("ir", self.ir),
            compiler=own.get("compiler", self.compiler),
            hook=own.get("hook", self.hook),
            split_at=own.get("split_at", self.split_at),
            decompositions=self.decompositions,
            instrument=self.instrument,
            mode=mode or self.mode,
            options={**self.options, **options},
        )
        configured.reports = self.reports
        if "pipeline" not in own:
            configured._parsed = self._parsed
        return configured

    # ----- the three paths ---------------------------------------------------------------
    def _run(self, gm: fx.GraphModule, inputs: Sequence[Any]) -> fx.GraphModule:
        result = self.pipeline.run(gm, inputs, instrument=self.instrument)
        if result.report is not None:
            self.reports.append(result.report)
        return result.graph_module

    def _compile_dynamo(self, gm: fx.GraphModule, inputs: list[Any]):
        if self.split_at is not None:
            return self._compile_pieces(gm, inputs)
        gm = self._run(gm, inputs)
        return self._final_compile(gm, inputs)

    def _compile_pieces(self, gm: fx.GraphModule, inputs: list[Any]):
        from .piecewise import _nothing_to_split, _split, split_predicate

        is_split = split_predicate(self.split_at)
        pieces = _split(gm, is_split)
        if pieces is None:
            ends = [*gm.graph.find_nodes(op="placeholder"), *gm.graph.find_nodes(op="output")]
            if any(map(is_split, ends)):  # a predicate that only the inputs/output satisfy
                raise _nothing_to_split(self.split_at)
            # a graph without the op (e.g. after a graph break): nothing to cut
            return self._final_compile(self._run(gm, inputs), inputs)
        pieces.run(self.pipeline)
        self.reports.extend(pieces.reports)
        if self.compiler != "eager":
            pieces.compile(self._final_compile)
        return pieces.module.forward

    def _final_compile(self, gm: fx.GraphModule, inputs: list[Any]):
        if self.compiler == "eager":
            return gm.forward
        if self.compiler == "inductor":
            from torch._inductor.compile_fx import compile_fx

            return compile_fx(gm, inputs, config_patches=self._inductor_patches())
        return self.compiler(gm, inputs)

    def _compile_inductor_hook(self, gm: fx.GraphModule, inputs: list[Any]):
        from torch._inductor import config
        from torch._inductor.compile_fx import compile_fx

        ours = _RecordingPass(self.pipeline, self.reports, self.instrument)
        patches = self._inductor_patches()
        patches[self.hook] = ours.chain(patches.get(self.hook, getattr(config, self.hook)))
        return compile_fx(gm, inputs, config_patches=patches)

    def _compile_aot(self, gm: fx.GraphModule, inputs: list[Any]):
        from functorch.compile import min_cut_rematerialization_partition
        from torch._dynamo.backends.common import aot_autograd

        compile_graph = functools.partial(_aot_compile, self)
        return aot_autograd(
            fw_compiler=compile_graph,
            bw_compiler=compile_graph,
            inference_compiler=compile_graph,
            partition_fn=min_cut_rematerialization_partition,
            keep_inference_input_mutations=True,
            decompositions=_decompositions(self.decompositions),
        )(gm, inputs)

    def _inductor_patches(self) -> dict[str, Any]:
        patches: dict[str, Any] = {}
        if self.mode is not None and self.mode != "default":
            patches.update(torch._inductor.list_mode_options(self.mode))
        patches.update(self.options)
        return patches

    def __repr__(self) -> str:
        compiler = self.compiler if isinstance(self.compiler, str) else "custom"
        split = f", split_at={self.split_at!r}" if self.split_at is not None else ""
        return (
            f"fxpass.backend({str(self.pipeline)!r}, ir={self.ir!r}, compiler={compiler!r}{split})"
        )


def _aot_compile(be: FxpassBackend, gm: fx.GraphModule, inputs: Sequence[Any]):
    gm = be._run(gm, inputs)
    if be.compiler == "eager":
        from torch._dynamo.backends.debugging import boxed_nop

        return boxed_nop(gm, list(inputs))
    return be.compiler(gm, list(inputs))


def _decompositions(decompositions: Any) -> Any:
    if decompositions == "core_aten":
        return torch._decomp.core_aten_decompositions()
    if isinstance(decompositions, str):
        raise ValueError(f"decompositions is 'core_aten', a table or None, not {decompositions!r}")
    return decompositions


class _RecordingPass(InductorPass):
    """The backend's Inductor pass: its reports go to the backend, its instruments apply."""

    def __init__(self, pipeline: Any, reports: list[Report], instrument: Sequence[Any]) -> None:
        super().__init__(pipeline)
        self.reports = reports
        self.instrument = tuple(instrument)

    def __call__(self, graph: fx.Graph) -> None:
        with instrumented(*self.instrument):
            super().__call__(graph)


def backend(
    pipeline: Any = None,
    ir: str = "aten",
    compiler: str | Callable[..., Any] = "inductor",
    *,
    hook: str = "post_grad_custom_pre_pass",
    split_at: Any = None,
    decompositions: Mapping[Any, Callable[..., Any]] | str | None = None,
    instrument: Iterable[Any] = (),
    mode: str | None = None,
    options: Mapping[str, Any] | None = None,
) -> FxpassBackend:
    """A torch.compile backend running ``pipeline`` (default: the ``default`` pipeline).

    Args:
        pipeline: a Pipeline, spec string, pass or list of passes; None reads the
            ``default`` pass list at every compile.
        ir: ``"aten"`` (AOTAutograd ATen graphs with fake sample inputs) or ``"dynamo"``
            (Dynamo's torch-level graph with real example inputs).
        compiler: ``"inductor"``, ``"eager"``, or a function ``(gm, example_inputs)``
            returning a callable.
        hook: with ``ir="aten"`` and Inductor, the Inductor hook the passes run at.
        split_at: with ``ir="dynamo"``, ops to cut the graph at (e.g. ``"attention"``);
            the pipeline and the compiler then work piece by piece.
        decompositions: for ``ir="aten"`` without Inductor: ``"core_aten"``, a table, or
            None (AOTAutograd's own).
        instrument: instrumentation attached to every run.
        mode, options: Inductor's ``mode`` and config ``options``, as for
            ``torch.compile(backend="inductor")``.
    """
    return FxpassBackend(
        pipeline,
        ir=ir,
        compiler=compiler,
        hook=hook,
        split_at=split_at,
        decompositions=decompositions,
        instrument=instrument,
        mode=mode,
        options=options,
    )


_DEFAULT: FxpassBackend | None = None


def fxpass_backend(
    gm: fx.GraphModule,
    example_inputs: Sequence[Any],
    *,
    mode: str | None = None,
    options: Mapping[str, Any] | None = None,
) -> Callable[..., Any]:
    """The ``"fxpass"`` backend: the ``default`` pipeline on Inductor's ATen graphs, then
    Inductor. ``torch.compile(..., options={"pipeline": "...", "ir": "dynamo",
    "compiler": "eager"})`` configures it; other options go to Inductor."""
    return default_backend()(gm, example_inputs, mode=mode, options=options)


def default_backend() -> FxpassBackend:
    """The backend behind ``backend="fxpass"`` (its ``reports`` and ``compiles``)."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = FxpassBackend()
    return _DEFAULT
