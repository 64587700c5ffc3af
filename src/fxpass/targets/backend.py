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
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import fx

from ..core.pipeline import Pipeline
from ..core.report import Report
from .inductor import HOOKS, InductorPass
from .piecewise import _nothing_to_split, _split, split_predicate
from .runner import Runner

__all__ = ["FxpassBackend", "backend", "fxpass_backend"]

IRS = ("aten", "dynamo")
COMPILERS = ("inductor", "eager")
_OWN_OPTIONS = ("pipeline", "ir", "compiler", "split_at", "hook")


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

    def __post_init__(self) -> None:
        if self.ir not in IRS:
            raise ValueError(f"ir must be one of {IRS} (what the passes see), not {self.ir!r}")
        if not callable(self.compiler) and self.compiler not in COMPILERS:
            raise ValueError(
                f"compiler must be one of {COMPILERS} or a function (gm, example_inputs) -> "
                f"callable, not {self.compiler!r}"
            )
        if self.split_at is not None and self.ir != "dynamo":
            raise ValueError(
                "split_at cuts Dynamo's graph before AOTAutograd: use it with ir='dynamo' "
                "(the pieces are then compiled with the compiler you chose)"
            )
        if self.hook not in HOOKS:
            raise ValueError(f"hook must be one of {HOOKS}, not {self.hook!r}")


class FxpassBackend:
    """A configured torch.compile backend (made by :func:`backend`); call it like any backend.

    ``reports`` holds the report of every pipeline run, ``compiles`` counts the graphs
    Dynamo handed over (one per compilation and recompilation).
    """

    __name__ = "fxpass"

    def __init__(self, settings: _Settings, runner: Runner | None = None) -> None:
        self.settings = settings
        self.runner = runner or Runner(settings.pipeline, instrument=settings.instrument)
        self.compiles = 0

    @property
    def pipeline(self) -> Pipeline:
        """The pipeline as it stands now (the ``default`` one is read at each compile)."""
        return self.runner.pipeline

    @property
    def reports(self) -> list[Report]:
        return self.runner.reports

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
        s = self.settings
        settings = replace(s, **own, mode=mode or s.mode, options={**s.options, **options})
        if "pipeline" in own:
            runner = Runner(settings.pipeline, instrument=s.instrument, reports=self.reports)
        else:
            runner = self.runner
        return FxpassBackend(settings, runner)

    def _compile(self, gm: fx.GraphModule, inputs: list[Any]) -> Callable[..., Any]:
        if self.settings.ir == "dynamo":
            return self._compile_dynamo(gm, inputs)
        if self.settings.compiler == "inductor":
            return self._compile_inductor_hook(gm, inputs)
        return self._compile_aot(gm, inputs)

    # ----- the three paths ---------------------------------------------------------------
    def _run(self, gm: fx.GraphModule, inputs: Sequence[Any]) -> fx.GraphModule:
        return self.runner.run(gm, inputs).graph_module

    def _compile_dynamo(self, gm: fx.GraphModule, inputs: list[Any]):
        if self.settings.split_at is not None:
            return self._compile_pieces(gm, inputs)
        gm = self._run(gm, inputs)
        return self._final_compile(gm, inputs)

    def _compile_pieces(self, gm: fx.GraphModule, inputs: list[Any]):
        is_split = split_predicate(self.settings.split_at)
        pieces = _split(gm, is_split)
        if pieces is None:
            ends = [*gm.graph.find_nodes(op="placeholder"), *gm.graph.find_nodes(op="output")]
            if any(map(is_split, ends)):  # a predicate that only the inputs/output satisfy
                raise _nothing_to_split(self.settings.split_at)
            # a graph without the op (e.g. after a graph break): nothing to cut
            return self._final_compile(self._run(gm, inputs), inputs)
        pieces.run(self.pipeline, instrument=self.settings.instrument)
        self.reports.extend(pieces.reports)
        if self.settings.compiler != "eager":
            pieces.compile(self._final_compile)
        return pieces.module.forward

    def _final_compile(self, gm: fx.GraphModule, inputs: list[Any]):
        if self.settings.compiler == "eager":
            return gm.forward
        if self.settings.compiler == "inductor":
            from torch._inductor.compile_fx import compile_fx

            return compile_fx(gm, inputs, config_patches=self._inductor_patches())
        return self.settings.compiler(gm, inputs)

    def _compile_inductor_hook(self, gm: fx.GraphModule, inputs: list[Any]):
        from torch._inductor import config
        from torch._inductor.compile_fx import compile_fx

        # the pipeline as it stands at this compile, run with the backend's instruments
        runner = Runner(self.pipeline, instrument=self.settings.instrument, reports=self.reports)
        ours = InductorPass(runner=runner)
        patches = self._inductor_patches()
        patches[self.settings.hook] = ours.chain(
            patches.get(self.settings.hook, getattr(config, self.settings.hook))
        )
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
            decompositions=_decompositions(self.settings.decompositions),
        )(gm, inputs)

    def _inductor_patches(self) -> dict[str, Any]:
        patches: dict[str, Any] = {}
        if self.settings.mode is not None and self.settings.mode != "default":
            patches.update(torch._inductor.list_mode_options(self.settings.mode))
        patches.update(self.settings.options)
        return patches

    def __repr__(self) -> str:
        compiler = self.settings.compiler if isinstance(self.settings.compiler, str) else "custom"
        split = (
            f", split_at={self.settings.split_at!r}" if self.settings.split_at is not None else ""
        )
        return f"fxpass.backend({str(self.pipeline)!r}, ir={self.settings.ir!r}, compiler={compiler!r}{split})"


def _aot_compile(be: FxpassBackend, gm: fx.GraphModule, inputs: Sequence[Any]):
    gm = be._run(gm, inputs)
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
    settings = _Settings(
        pipeline, ir, compiler, hook, split_at, decompositions, tuple(instrument), mode
    )
    return FxpassBackend(replace(settings, options=dict(options or {})))


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
        _DEFAULT = FxpassBackend(_Settings())
    return _DEFAULT
