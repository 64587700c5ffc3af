"""The pass contract: what counts as a pass, and what running one returns.

A pass is any of

* a function ``(gm) -> bool | None | PassResult | GraphModule`` (torch.fx, SGLang style);
* a lowering function ``(gm, sample_inputs) -> GraphModule`` (Torch-TensorRT style);
* an object with ``requires(gm)``, ``call(gm)`` and ``ensures(gm)`` — a :class:`Pass`
  subclass, a ``torch.fx.passes.infra.pass_base.PassBase``, an ExecuTorch pass;
* a :class:`~fxpass.Pipeline` (pipelines nest).

**The context is an argument.** A pass that asks for the run's
:class:`~fxpass.PassContext` gets it: a function (or a class's ``call``) with a parameter
named ``ctx`` is called with ``ctx=`` the context of the pass now running (its
``ctx.editor``, ``ctx.analyses``, ``ctx.stat``), and ``ctx`` is neither an option nor a
lowering pass's second argument. A pass without that parameter is called as before.

:func:`pass_of` turns each into a :class:`Pass` (:func:`fxpass.as_pass` also looks up
registered names). "Modified" is honest: when a pass does not
say whether it changed the graph (it returns ``None`` or a module), the pipeline compares a
cheap structural fingerprint taken before and after it; when it says False but did change
the graph, the pipeline counts it as changed and notes the discrepancy in the report.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from torch import fx
from torch.fx.passes.infra.pass_base import PassResult as _TorchPassResult

from .run import PassGroup, PassResult

__all__ = [
    "METADATA",
    "FunctionPass",
    "ObjectPass",
    "Pass",
    "PassResult",
    "is_lowering",
    "takes_context",
    "metadata_keys",
    "pass_of",
]

#: The node metadata a pass can promise to keep valid (its ``keeps`` declaration), checked
#: after each pass by ``fxpass.verify.keeps_metadata``:
#:
#: * ``val``: nodes keep ``meta['val']``; new and rewired nodes have one that matches what
#:   their op gives on their inputs' values (shape and dtype);
#: * ``layouts``: ... and the strides too, and the users of new nodes still fit them;
#: * ``stack_trace``, ``nn_module_stack``: nodes keep them; new nodes carry them when the
#:   nodes they were made from did;
#: * ``provenance``: new nodes carry torch's ``meta['from_node']``, nodes keep theirs;
#: * ``stream``: in a graph with stream assignments, nodes keep ``meta['stream']`` and new
#:   compute nodes get one.
METADATA = ("val", "layouts", "stack_trace", "nn_module_stack", "provenance", "stream")


def metadata_keys(keys: Any, who: str = "a pass") -> frozenset[str]:
    """``keys`` (names from :data:`METADATA`, or ``"all"``) as a set; an unknown name is an
    error naming ``who``."""
    if isinstance(keys, str):
        keys = METADATA if keys == "all" else (keys,)
    out = frozenset(keys)
    unknown = sorted(out - set(METADATA))
    if unknown:
        raise ValueError(
            f"{who} declares it keeps unknown metadata {', '.join(map(repr, unknown))}; "
            f"keeps= takes names from {', '.join(METADATA)} (or 'all')"
        )
    return out


def _snake(name: str) -> str:
    name = re.sub(r"Pass$", "", name) or name
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


class Pass:
    """Base class for passes with a ``requires -> call -> ensures`` contract.

    Subclass it and implement :meth:`call`; ``requires`` and ``ensures`` are optional checks
    that raise when the graph does not meet the pass's pre- or post-conditions. Declare the
    statistics the pass counts in ``statistics`` (name -> description) and count them with
    :func:`fxpass.stat`. Set ``needs_code = True`` if the pass runs the module's Python code
    (the pipeline regenerates it first; otherwise code is regenerated once per run).

    Calling a pass on a module runs it as a one-pass pipeline: honest "modified", rollback on
    failure, one recompile.

    ``invariants`` are checks (``gm -> None``, raising when violated) that hold from this pass
    on: once it has changed the graph, the pipeline runs them after it and after every later
    pass of the same run, like lint (a pass that schedules streams installs the stream
    checker, so a later pass that breaks the schedule fails and rolls back).

    ``preserves`` names the analyses (see :mod:`fxpass.core.analysis_manager`) whose cached values
    are still right after the pass changed the graph; ``keeps`` the node metadata (from
    :data:`METADATA`) the pass keeps valid, which ``fxpass.verify.keeps_metadata`` checks.
    """

    name: str = ""
    #: How the pass was written where it came from (``fuse{eps=1e-6}``, ``pkg.mod:fn``): set
    #: once, by the registry or the spec reader that built it; :attr:`spec` prints it.
    written_as: str | None = None
    needs_code: bool = False
    statistics: Mapping[str, str] = {}
    invariants: Sequence[Callable[[fx.GraphModule], Any]] = ()
    preserves: Sequence[Any] = ()
    keeps: frozenset[str] = frozenset()
    #: ``"editor"``: every change the pass makes goes through the editor (metadata writes
    #: only on nodes it made or changed through it), so the run undoes it from the editor's
    #: journal; ``"any"``: it may edit otherwise, and the run snapshots the graph first.
    edits: str = "any"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not cls.__dict__.get("name"):
            cls.name = _snake(cls.__name__)
        if "keeps" in cls.__dict__:
            cls.keeps = metadata_keys(cls.keeps, f"pass class {cls.__name__}")

    @property
    def spec(self) -> str:
        """The pass as text in a pipeline spec (its registered name and options)."""
        return self.written_as or self.name

    def requires(self, gm: fx.GraphModule) -> None:
        """Raise if ``gm`` does not meet this pass's preconditions."""

    def call(self, gm: fx.GraphModule) -> bool | PassResult | fx.GraphModule | None:
        """Transform ``gm`` (in place, or return a new module) and say whether it changed.
        An override declared ``call(self, gm, ctx)`` is handed the run's context."""
        raise NotImplementedError(f"{type(self).__name__} must implement call(gm)")

    def ensures(self, gm: fx.GraphModule) -> None:
        """Raise if ``gm`` does not meet this pass's postconditions."""

    def execute(self, gm: fx.GraphModule, ctx: Any) -> Any:
        """Run the pass inside a pipeline (the pipeline interprets the return value)."""
        self.requires(gm)
        result = _call(self.call, gm, ctx)
        out = _module_of(result, gm)
        self.ensures(out)
        return result

    def __call__(self, gm: fx.GraphModule, sample_inputs: Sequence[Any] | None = None, **kw):
        """Run the pass on ``gm`` as a one-pass run (keywords as for ``Pipeline.run``); what
        it needs before or after it may have run earlier, so that is not checked."""
        return PassGroup([self], name=self.name).run(gm, sample_inputs, **kw)

    def __str__(self) -> str:
        return self.spec

    def __repr__(self) -> str:
        return f"<pass {self.spec}>"


def _module_of(result: Any, gm: fx.GraphModule) -> fx.GraphModule:
    if isinstance(result, _TorchPassResult):
        return result.graph_module
    if isinstance(result, fx.GraphModule):
        return result
    return gm


def _import_path(fn: Callable) -> str | None:
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if not module or "<" in qualname or module == "__main__":
        return None
    return f"{module}:{qualname}"


#: The parameter a pass names to be handed the run's context.
CONTEXT_PARAMETER = "ctx"


def takes_context(fn: Callable) -> bool:
    """Does ``fn`` ask for the run's context: a parameter named ``ctx`` it can take by name?"""
    try:
        param = inspect.signature(fn).parameters.get(CONTEXT_PARAMETER)
    except (TypeError, ValueError):
        return False
    return param is not None and param.kind in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY)


def is_lowering(fn: Callable) -> bool:
    """A function taking ``(gm, sample_inputs)``: two positional parameters with no defaults
    (``ctx``, the run's context, is not one of them)."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return False
    positional = [
        p
        for p in params
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        and p.default is p.empty
        and p.name != CONTEXT_PARAMETER
    ]
    return len(positional) >= 2


def _call(method: Callable, gm: fx.GraphModule, ctx: Any, *args: Any, **kwargs: Any) -> Any:
    """``method(gm, ...)``, handing it ``ctx=`` when it asks for the context."""
    if takes_context(method):
        kwargs[CONTEXT_PARAMETER] = ctx
    return method(gm, *args, **kwargs)


class FunctionPass(Pass):
    """A function used as a pass: ``fn(gm)``, or ``fn(gm, sample_inputs)`` for lowering
    passes; ``fn(gm, ctx)`` (a parameter named ``ctx``) is handed the run's context."""

    def __init__(
        self,
        fn: Callable,
        name: str | None = None,
        *,
        lowering: bool | None = None,
        needs_code: bool | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        self.fn = fn
        self.name = name or getattr(fn, "__name__", type(fn).__name__)
        self.lowering = is_lowering(fn) if lowering is None else lowering
        self.options = dict(options or {})
        if needs_code is not None:
            self.needs_code = needs_code
        else:
            self.needs_code = bool(getattr(fn, "needs_code", False))
        path = _import_path(fn)
        if path and not options and name is None:
            self.written_as = path
        self.statistics = dict(getattr(fn, "statistics", {}))
        self.invariants = tuple(getattr(fn, "invariants", ()))
        self.preserves = tuple(getattr(fn, "preserves", ()))
        self.keeps = metadata_keys(getattr(fn, "keeps", ()), f"pass '{self.name}'")
        self.edits = getattr(fn, "edits", "any")

    def call(self, gm: fx.GraphModule):
        raise RuntimeError("FunctionPass runs through execute()")  # pragma: no cover

    def execute(self, gm: fx.GraphModule, ctx: Any) -> Any:
        if self.lowering:
            inputs = ctx.sample_inputs if ctx is not None else None
            return _call(
                self.fn, gm, ctx, list(inputs) if inputs is not None else [], **self.options
            )
        return _call(self.fn, gm, ctx, **self.options)

    def __repr__(self) -> str:
        kind = "lowering pass" if self.lowering else "pass"
        return f"<{kind} {self.spec}>"


class ObjectPass(Pass):
    """An object with ``call`` (and optionally ``requires``/``ensures``), e.g. torch's PassBase."""

    def __init__(self, obj: Any, name: str | None = None) -> None:
        self.obj = obj
        self.name = name or getattr(obj, "name", None) or _snake(type(obj).__name__)
        self.needs_code = bool(getattr(obj, "needs_code", False))
        self.statistics = dict(getattr(obj, "statistics", {}))
        self.invariants = tuple(getattr(obj, "invariants", ()))
        self.preserves = tuple(getattr(obj, "preserves", ()))
        self.keeps = metadata_keys(getattr(obj, "keeps", ()), f"pass '{self.name}'")
        self.edits = getattr(obj, "edits", "any")

    def execute(self, gm: fx.GraphModule, ctx: Any) -> Any:
        obj = self.obj
        if callable(getattr(obj, "requires", None)):
            obj.requires(gm)
        result = _call(obj.call, gm, ctx)
        if callable(getattr(obj, "ensures", None)):
            obj.ensures(_module_of(result, gm))
        return result


def pass_of(obj: Any) -> Pass:
    """Turn a pass object, class or function into a :class:`Pass` (a registered name is
    looked up by :func:`fxpass.as_pass`, which calls this for everything else)."""
    if isinstance(obj, Pass):
        return obj
    if isinstance(obj, str):
        raise TypeError(f"'{obj}' is a pass name: look it up with fxpass.as_pass('{obj}')")
    if isinstance(obj, type):
        if issubclass(obj, Pass):
            return obj()
        if callable(getattr(obj, "call", None)):
            return ObjectPass(obj())
        raise TypeError(
            f"{obj.__name__} is a class but not a pass: give it a call(gm) method "
            "or subclass fxpass.Pass"
        )
    if callable(getattr(obj, "call", None)) and not inspect.isfunction(obj):
        return ObjectPass(obj)
    if callable(obj):
        return FunctionPass(obj)
    raise TypeError(
        f"{obj!r} is not a pass: expected a function (gm) -> ..., a lowering function "
        "(gm, sample_inputs) -> gm, an object with call(gm), a Pipeline, or a registered name"
    )
