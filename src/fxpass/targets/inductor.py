"""The Inductor hook: run a pipeline as an Inductor custom graph pass, with a stable ``uuid()``.

Inductor calls a pass installed at ``post_grad_custom_pre_pass`` or
``post_grad_custom_post_pass`` with the ATen graph of every forward and backward graph it
compiles (vLLM's fusion passes sit there). Its FX graph cache keys compiled graphs on the
pass's ``uuid()``: a pass without one turns the cache off, and a uuid that does not change
when the pass changes serves stale code. :func:`inductor_pass` gives a pass whose uuid is

* the same in every process for the same pipeline (no ``id()``, no ``hash()``);
* different when the pipeline's passes, their order, their options or their code change —
  code meaning the source file that defines each pass (and each fxpass base class it
  builds on), so helpers in the same file count too — or when the code of fxpass's custom
  ops changes (``fxpass/ops`` and the ``fxpass/fxutil`` helpers their kernels call): Inductor
  compiles against an op's fake kernel, so a changed layout rule must not meet a stale graph.

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
import enum
import functools
import hashlib
import inspect
import os
import types
from collections.abc import Iterator
from typing import Any

import torch
from torch import fx

from ..core.contract import FunctionPass, ObjectPass, Pass
from ..core.pipeline import Pipeline
from ..core.report import Report
from ..core.version import __version__
from ..fxutil.paths import get_path, has_path
from .runner import Runner, graph_sample_inputs, resolve_pipeline

__all__ = ["HOOKS", "InductorPass", "inductor_pass", "pipeline_uuid"]

HOOKS = ("post_grad_custom_pre_pass", "post_grad_custom_post_pass")


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
    (a backend's, with its instruments and reports).
    """

    def __init__(
        self,
        pipeline: Any = None,
        *,
        previous: tuple[Any, ...] = (),
        runner: Runner | None = None,
    ) -> None:
        _register_with_inductor()
        self.runner = runner or Runner(resolve_pipeline(pipeline))
        self.previous = tuple(previous)

    @property
    def pipeline(self) -> Pipeline:
        return self.runner.pipeline

    @property
    def reports(self) -> list[Report]:
        return self.runner.reports

    def __call__(self, graph: fx.Graph) -> None:
        for p in self.previous:
            p(graph)
        gm = graph.owning_module
        if not isinstance(gm, fx.GraphModule):
            raise TypeError("fxpass's Inductor pass needs a graph that belongs to a GraphModule")
        result = self.runner.run(gm, graph_sample_inputs(gm))
        if result.graph_module is not gm:  # Inductor edits ``graph`` in place: copy back
            _replace_graph(gm, result.graph_module)

    def uuid(self) -> str | None:
        """Stable across processes; changes with the pipeline, options and pass code."""
        parts = ["fxpass-inductor-pass", pipeline_uuid(self.pipeline)]
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


def _replace_graph(gm: fx.GraphModule, new: fx.GraphModule) -> None:
    """Make ``gm.graph`` hold ``new``'s nodes (Inductor keeps using the graph object)."""
    graph = gm.graph
    for node in reversed(list(graph.nodes)):  # users go before the nodes they read
        graph.erase_node(node)
    value_map: dict[fx.Node, fx.Node] = {}
    out = graph.graph_copy(new.graph, value_map, return_output_node=True)
    if out is not None:
        value, old_output = out
        graph.output(value).meta.update(old_output.meta)
    for node in graph.nodes:
        if node.op in ("get_attr", "call_module") and not has_path(gm, str(node.target)):
            setattr(gm, str(node.target), get_path(new, str(node.target)))


# ----- the uuid ----------------------------------------------------------------------------------
def pipeline_uuid(pipeline: Any) -> str:
    """A hex digest naming ``pipeline`` exactly: passes, order, options, and their code."""
    h = hashlib.sha256()
    h.update(f"fxpass {__version__}\n".encode())
    h.update(_ops_code_id().encode())
    _hash_pass(resolve_pipeline(pipeline), h)
    return h.hexdigest()


#: Packages (under fxpass/) whose files define fxpass's custom ops and the helpers their fake
#: kernels call. Fixed, not "whatever is registered now", so the uuid is the same in every
#: process whatever it has imported.
_OP_PACKAGES = ("ops", "fxutil")


def _ops_code_id(root: str | None = None, packages: tuple[str, ...] = _OP_PACKAGES) -> str:
    """A digest line of every Python file in ``packages`` (directories under ``root``,
    fxpass's source directory by default)."""
    root = root or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    parts = []
    for package in packages:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, package)):
            dirnames.sort()
            for name in sorted(f for f in filenames if f.endswith(".py")):
                path = os.path.join(dirpath, name)
                stat = os.stat(path)
                digest = _file_digest(path, stat.st_mtime_ns, stat.st_size)
                parts.append(f"{os.path.relpath(path, root)}@{digest}")
    return "ops " + ";".join(parts) + "\n"


def _hash_pass(p: Pass, h: Any) -> None:
    h.update(f"pass {type(p).__module__}.{type(p).__qualname__} {p.spec}\n".encode())
    if isinstance(p, Pipeline):
        h.update(_stable(_public_state(p, skip=("checks", "instrument"))).encode())
        for check in p.checks:
            h.update(_code_id(check).encode())
        for child in p.passes:
            _hash_pass(child, h)
        return
    if isinstance(p, FunctionPass):
        h.update(_code_id(p.fn).encode())
        h.update(_stable(sorted(p.options.items())).encode())
        extra = getattr(p.fn, "cache_key", None)  # what else the pass depends on (a rank)
        if extra is not None:
            h.update(f"{extra(**p.options)}\n".encode())
        h.update(f"lowering={p.lowering}\n".encode())
        return
    target = p.obj if isinstance(p, ObjectPass) else p
    for cls in type(target).__mro__:
        if cls.__module__ not in ("builtins",) and not cls.__module__.startswith("torch."):
            h.update(_code_id(cls).encode())
    h.update(_stable(_public_state(target)).encode())


def _public_state(obj: Any, skip: tuple[str, ...] = ()) -> list[tuple[str, Any]]:
    state = getattr(obj, "__dict__", {})
    return sorted((k, v) for k, v in state.items() if not k.startswith("_") and k not in skip)


def _stable(value: Any, depth: int = 0) -> str:
    """A text for ``value`` that is the same in every process (no addresses, no hash())."""
    if depth > 6:
        return "..."
    if value is None or isinstance(value, (bool, int, float, str, bytes)):
        return repr(value)
    if isinstance(value, enum.Enum):
        return f"{type(value).__qualname__}.{value.name}"
    if isinstance(value, (list, tuple)):
        inner = ",".join(_stable(v, depth + 1) for v in value)
        return f"{type(value).__name__}[{inner}]"
    if isinstance(value, (set, frozenset)):
        return "set[" + ",".join(sorted(_stable(v, depth + 1) for v in value)) + "]"
    if isinstance(value, dict):
        items = sorted((_stable(k, depth + 1), _stable(v, depth + 1)) for k, v in value.items())
        return "{" + ",".join(f"{k}:{v}" for k, v in items) + "}"
    if isinstance(value, (torch._ops.OpOverload, torch._ops.OpOverloadPacket, torch.dtype)):
        return str(value)
    if isinstance(value, torch.Tensor):
        return f"tensor{tuple(value.shape)}{value.dtype}"
    if isinstance(value, Pass):
        h = hashlib.sha256()
        _hash_pass(value, h)
        return f"pass:{h.hexdigest()}"
    if isinstance(value, (types.FunctionType, types.MethodType, type, functools.partial)):
        return _code_id(value)
    state = _public_state(value)
    return f"{type(value).__module__}.{type(value).__qualname__}({_stable(state, depth + 1)})"


def _code_id(obj: Any) -> str:
    """Where ``obj`` is defined and a digest of the file that defines it."""
    if isinstance(obj, functools.partial):
        return f"partial({_code_id(obj.func)},{_stable(obj.args)},{_stable(obj.keywords)})"
    obj = inspect.unwrap(getattr(obj, "__func__", obj))
    name = f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', type(obj).__name__)}"
    try:
        path = inspect.getsourcefile(obj)
    except TypeError:
        path = None
    if path and os.path.exists(path):
        stat = os.stat(path)
        return f"{name}@{_file_digest(path, stat.st_mtime_ns, stat.st_size)}"
    code = getattr(obj, "__code__", None)
    return f"{name}@{_code_digest(code)}" if code is not None else name


@functools.lru_cache(maxsize=512)
def _file_digest(path: str, mtime_ns: int, size: int) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()[:24]


def _code_digest(code: types.CodeType) -> str:
    h = hashlib.sha256(code.co_code)
    h.update(repr(code.co_names).encode())
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            h.update(_code_digest(const).encode())
        else:
            h.update(_stable(const).encode())
    return h.hexdigest()[:24]
