"""SGLang's NPU-backend PassManager API, on fxpass.

SGLang's ``NpuGraphCompilerBackend`` applies passes like this::

    pm = PassManager(graph_module)
    pm.add(NpuAddRmsNormQuantFuse)   # a class with static pattern() / replacement()
    pm.add(EraseCopy)                # a class whose instances are called on the module
    pm.apply()
    graph_module.recompile()

The same code runs on this class, with differences users asked for: a failing pass raises a
:class:`~fxpass.PassFailedError` naming it (SGLang's manager swallows every exception) and the
module is restored to its state before ``apply()`` (SGLang's is left half-rewritten);
``apply()`` regenerates the module's code once and returns a
:class:`~fxpass.PassResult` with the run's report; pattern passes use fxpass's linear-time
``replace_pattern``, whose new nodes keep their metadata. Like every fxpass door it runs
through the one Runner (:func:`~fxpass.compat._policy.run_managed`): the report says
``door=sglang``, ``TORCH_TRACE`` gets the run's artifacts, and ``PassManager(gm, cache=folder)``
restores the result of an earlier run on the same graph with the same passes.
"""

from __future__ import annotations

from typing import Any

from torch import fx

from ..core.context import PassContext
from ..core.contract import FunctionPass, Pass, PassResult
from ..core.pass_registry import as_pass
from ..core.pipeline import Pipeline
from ._policy import run_managed

__all__ = ["PassManager"]


def _pattern_pass(cls: type) -> Pass:
    def apply_pattern(gm: fx.GraphModule, ctx: PassContext) -> bool:
        from .fx import replace_pattern, replace_pattern_with_filters

        filters = getattr(cls, "match_filters", None)
        if filters:
            matches = replace_pattern_with_filters(gm, cls.pattern, cls.replacement, filters)
        else:
            matches = replace_pattern(gm, cls.pattern, cls.replacement)
        ctx.stat("matches", len(matches))
        return bool(matches)

    return FunctionPass(apply_pattern, cls.__name__)


def _callable_pass(obj: Any, name: str) -> Pass:
    def call(gm: fx.GraphModule) -> None:
        obj(gm)  # SGLang passes return match lists or nothing: the pipeline detects changes

    return FunctionPass(call, name)


class PassManager:
    """Collect pass classes with :meth:`add`, run them in order with :meth:`apply`.

    ``cache`` (fxpass's; a folder or :class:`~fxpass.core.cache.PipelineCache`) keeps the
    results of runs and restores them instead of running the passes again.
    """

    def __init__(self, graph_module: fx.GraphModule, *, cache: Any = None) -> None:
        if not isinstance(graph_module, fx.GraphModule):
            raise TypeError(
                f"PassManager expects a torch.fx.GraphModule, got {type(graph_module).__name__}"
            )
        self.graph_module = graph_module
        self.passes: list[Pass] = []
        self.report: Any = None
        self.cache = cache

    def add(self, pass_: Any, *args: Any, **kwargs: Any) -> None:
        """Add a pass: a class with ``pattern``/``replacement``, or a class (or instance) to call.

        Extra arguments are given to the class when it is instantiated.
        """
        if isinstance(pass_, type) and hasattr(pass_, "pattern") and hasattr(pass_, "replacement"):
            self.passes.append(_pattern_pass(pass_))
            return
        obj = pass_(*args, **kwargs) if isinstance(pass_, type) else pass_
        name = type(obj).__name__ if isinstance(pass_, type) else getattr(obj, "__name__", None)
        if isinstance(obj, Pass) or callable(getattr(obj, "call", None)):
            self.passes.append(as_pass(obj))
        elif callable(obj):
            self.passes.append(_callable_pass(obj, name or type(obj).__name__))
        else:
            raise TypeError(
                f"cannot add {pass_!r}: a pass is a class with static pattern() and "
                "replacement(), or a class whose instances are called on the graph module"
            )

    def apply(self) -> PassResult:
        """Run the passes in order; raises and restores the module if one fails."""
        pipeline = Pipeline(self.passes, name="sglang")
        result = run_managed(pipeline, self.graph_module, door="sglang", cache=self.cache)
        self.graph_module = result.graph_module
        self.report = result.report
        return result
