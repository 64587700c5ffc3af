"""The Inductor hook: run a pipeline as an Inductor custom graph pass, with a stable ``uuid()``.

Inductor calls a pass installed at one of its hooks (:data:`HOOKS`: ``pre_grad_custom_pass``,
``joint_custom_pre_pass``, ``joint_custom_post_pass``, ``post_grad_custom_pre_pass``,
``post_grad_custom_post_pass``; :mod:`fxpass.targets.hooks` says what each sees) with the
graph it compiles — vLLM's fusion passes sit at ``post_grad_custom_post_pass``. Its FX graph
cache keys compiled graphs on the pass's ``uuid()``: a pass without one turns the cache off,
and a uuid that does not change when the pass changes serves stale code.
:func:`inductor_pass` gives a pass whose uuid is

* the same in every process for the same pipeline (no ``id()``, no ``hash()``);
* built from each pass's own uuid (:func:`fxpass.core.identity.pass_uuid`: its code and the
  code of its package it uses, its options, the ranges it applies to, the passes it needs),
  the order of the passes and the compile range — so editing one pass invalidates exactly
  the cached graphs that pass ran on — and from the code of fxpass's custom ops
  (``fxpass/ops`` and the ``fxpass/fxutil`` helpers their kernels call): Inductor compiles
  against an op's fake kernel, so a changed layout rule must not meet a stale graph.

Installing chains: :meth:`InductorPass.install` and :meth:`InductorPass.installed` put the
pass *after* whatever is already at the hook instead of replacing it, and the chained
uuid covers both.

>>> torch._inductor.config.post_grad_custom_post_pass = fxpass.inductor_pass(pipe)  # doctest: +SKIP
>>> with fxpass.inductor_pass(pipe).installed():                                     # doctest: +SKIP
...     torch.compile(model)(x)
"""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from torch import fx

from ..core.cache import replace_graph
from ..core.identity import OP_PACKAGES, ops_code_id
from ..core.identity import pipeline_uuid as _pipeline_uuid
from ..core.pipeline import Pipeline
from ..core.ranges import SizeRange, compile_range, format_ranges
from ..core.report import Report
from .hooks import INDUCTOR_HOOKS
from .runner import Runner, graph_sample_inputs, resolve_pipeline

__all__ = ["HOOKS", "InductorPass", "inductor_pass", "pipeline_uuid"]

#: Where Inductor runs custom passes (see :mod:`fxpass.targets.hooks` for what each sees).
HOOKS = INDUCTOR_HOOKS


@functools.cache
def _register_with_inductor() -> Any:
    # Importing torch._inductor takes seconds, so ``import fxpass`` must not: the class
    # becomes a (virtual) CustomGraphPass when the first instance is made.
    from torch._inductor.custom_graph_pass import CustomGraphPass

    CustomGraphPass.register(InductorPass)
    return CustomGraphPass


class InductorPass:
    """A pipeline as an Inductor ``CustomGraphPass`` (see :func:`inductor_pass`).

    ``previous`` are passes that run first (what was installed at the hook before);
    ``reports`` collects the report of every run. ``runner`` runs the pipeline instead
    (a backend's, with its instruments and reports). ``ranges`` is the compile range the
    graphs are compiled for (its range-limited passes run only there; it is part of the
    uuid); ``on_report`` is called with the report of each run.
    """

    def __init__(
        self,
        pipeline: Any = None,
        *,
        previous: tuple[Any, ...] = (),
        runner: Runner | None = None,
        ranges: Mapping[str, SizeRange] | None = None,
        on_report: Callable[[Report], None] | None = None,
    ) -> None:
        _register_with_inductor()
        self.runner = runner or Runner(resolve_pipeline(pipeline))
        self.previous = tuple(previous)
        self.ranges = dict(ranges) if ranges else None
        self.on_report = on_report

    @property
    def pipeline(self) -> Pipeline:
        return self.runner.pipeline

    @property
    def reports(self) -> list[Report]:
        return self.runner.reports

    def __call__(self, graph: fx.Graph) -> None:
        for p in self.previous:
            p(graph)
        gm = graph.owning_module if isinstance(graph, fx.Graph) else graph
        if not isinstance(gm, fx.GraphModule):
            raise TypeError("fxpass's Inductor pass needs a graph that belongs to a GraphModule")
        # the backward graph compiles later, outside the compile that set the range
        scope = compile_range(self.ranges) if self.ranges else contextlib.nullcontext()
        with scope:
            result = self.runner.run(gm, graph_sample_inputs(gm))
        if result.graph_module is not gm:  # Inductor edits ``graph`` in place: copy back
            replace_graph(gm, result.graph_module)
        if self.on_report is not None and result.report is not None:
            self.on_report(result.report)

    def uuid(self) -> str | None:
        """Stable across processes; changes with the pipeline (each pass's code, options
        and declarations) and the compile range."""
        ranges = format_ranges(self.ranges) if self.ranges else "-"
        parts = ["fxpass-inductor-pass", pipeline_uuid(self.pipeline), f"range {ranges}"]
        custom_graph_pass = _register_with_inductor()
        for p in self.previous:
            if not isinstance(p, custom_graph_pass):
                return None  # a plain callable at the hook: Inductor cannot cache anyway
            u = p.uuid()
            if u is None:
                return None
            parts.append(f"{type(p).__qualname__}:{u!r}")
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()

    # ----- installing --------------------------------------------------------------------
    def chain(self, existing: Any) -> InductorPass:
        """A pass that runs ``existing`` (a pass, a list of passes or None), then this one."""
        if existing is None:
            return self
        before = tuple(existing) if isinstance(existing, (list, tuple)) else (existing,)
        new = copy.copy(self)
        new.previous = (*before, *self.previous)
        return new

    def install(self, hook: str = "post_grad_custom_post_pass") -> InductorPass:
        """Put this pass at ``hook`` after the pass already there; returns what was installed."""
        from torch._inductor import config

        _check_hook(hook)
        chained = self.chain(getattr(config, hook))
        setattr(config, hook, chained)
        return chained

    @contextlib.contextmanager
    def installed(self, hook: str = "post_grad_custom_post_pass") -> Iterator[InductorPass]:
        """Install at ``hook`` (chained) for the duration of the block."""
        from torch._inductor import config

        _check_hook(hook)
        chained = self.chain(getattr(config, hook))
        with config.patch({hook: chained}):
            yield chained

    def __repr__(self) -> str:
        chained = f", after {len(self.previous)} pass(es)" if self.previous else ""
        return f"InductorPass({str(self.pipeline)!r}{chained})"


def inductor_pass(pipeline: Any = None) -> InductorPass:
    """An Inductor custom graph pass that runs ``pipeline`` (default: the ``default`` one).

    Assign it to ``torch._inductor.config.post_grad_custom_post_pass`` (or ``..._pre_pass``),
    or call ``.install()`` / ``.installed()`` to chain it after a pass already there.
    Lowering passes get the graph's fake inputs as ``sample_inputs``.
    """
    return InductorPass(pipeline)


def _check_hook(hook: str) -> None:
    if hook not in HOOKS:
        raise ValueError(f"unknown Inductor hook {hook!r}; fxpass installs at one of {HOOKS}")


# ----- the uuid ----------------------------------------------------------------------------------
def pipeline_uuid(pipeline: Any) -> str:
    """A hex digest naming ``pipeline`` exactly: passes, order, options, and their code
    (see :func:`fxpass.core.identity.pipeline_uuid`)."""
    return _pipeline_uuid(resolve_pipeline(pipeline))


def _ops_code_id(root: str | None = None, packages: tuple[str, ...] = OP_PACKAGES) -> str:
    """A digest line of the files defining fxpass's custom ops (see
    :func:`fxpass.core.identity.ops_code_id`)."""
    return ops_code_id(root, packages)
