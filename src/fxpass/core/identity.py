"""Stable identities: a uuid per pass and per pipeline, a structural hash per graph.

Caches need names that are the same in every process for the same thing and change when
anything that decides the result changes. :func:`pass_uuid` is built from

* the pass's **code**: the bytecode, constants, defaults and closure of its function (or of
  every method its class defines, and its base classes outside torch), and of the
  functions, classes and constants of its own package it uses — its *dependencies*. Line
  numbers are left out, so editing one pass changes that pass's uuid and not its
  neighbours' in the same file;
* its **options** (what a spec writes in braces, or the public state of a pass object);
* what it **declares**: the size ranges it applies to, the passes it needs before it and
  the passes that must follow it.

:func:`pipeline_uuid` combines the uuids of a pipeline's passes in order with the pipeline's
own settings, fxpass's version and the code of fxpass's custom ops (Inductor compiles
against their fake kernels, so a changed layout rule must not meet a stale graph).
:func:`graph_hash` names a graph by its structure: ops, arguments, node metadata that
decides results (shapes, dtypes, strides) and the content of the tensors it holds.

>>> pass_uuid(my_pass) == pass_uuid(my_pass)          # doctest: +SKIP
True
"""

from __future__ import annotations

import enum
import functools
import hashlib
import inspect
import os
import sys
import types
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import fx

from .contract import FunctionPass, ObjectPass, Pass
from .pipeline import Pipeline
from .ranges import declared_ranges, format_ranges
from .requirements import declared_followers, declared_needs
from .version import __version__

__all__ = [
    "UnhashableGraph",
    "graph_hash",
    "ops_code_id",
    "pass_uuid",
    "pipeline_uuid",
    "stable_text",
]


def pipeline_uuid(pipeline: Pipeline | Pass) -> str:
    """A hex digest naming ``pipeline`` exactly: passes, order, options, code, declarations."""
    h = hashlib.sha256()
    h.update(f"fxpass {__version__} python {sys.version_info[:2]}\n".encode())
    h.update(ops_code_id().encode())
    h.update(pass_uuid(pipeline).encode())
    return h.hexdigest()


def pass_uuid(p: Pass) -> str:
    """A hex digest naming one pass (a pipeline: its settings and its passes' uuids)."""
    h = hashlib.sha256()
    h.update(f"pass {type(p).__module__}.{type(p).__qualname__} {p.spec}\n".encode())
    ranges = declared_ranges(p)
    h.update(f"applies_to {format_ranges(ranges) if ranges else '-'}\n".encode())
    h.update(f"needs {declared_needs(p)} followed_by {declared_followers(p)}\n".encode())
    if isinstance(p, Pipeline):
        h.update(stable_text(_public_state(p, skip=("checks", "instrument"))).encode())
        for check in p.checks:
            h.update(code_id(check).encode())
        for child in p.passes:
            h.update(f"child {pass_uuid(child)}\n".encode())
        return h.hexdigest()
    if isinstance(p, FunctionPass):
        h.update(code_id(p.fn).encode())
        h.update(stable_text(sorted(p.options.items())).encode())
        extra = getattr(p.fn, "cache_key", None)  # what else the pass depends on (a rank)
        if extra is not None:
            h.update(f"{extra(**p.options)}\n".encode())
        h.update(f"lowering={p.lowering}\n".encode())
        return h.hexdigest()
    target = p.obj if isinstance(p, ObjectPass) else p
    for cls in type(target).__mro__:
        if not _outside(cls):
            h.update(code_id(cls).encode())
    h.update(stable_text(_public_state(target)).encode())
    return h.hexdigest()


# ----- code ----------------------------------------------------------------------------------
def code_id(obj: Any) -> str:
    """Where ``obj`` (a function, method, class or partial) is defined and a digest of its
    code and of the code of its package it uses."""
    if isinstance(obj, functools.partial):
        return f"partial({code_id(obj.func)},{stable_text(obj.args)},{stable_text(obj.keywords)})"
    obj = inspect.unwrap(getattr(obj, "__func__", obj))
    name = f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', type(obj).__name__)}"
    h = hashlib.sha256()
    _digest_object(obj, h, set(), _package(obj))
    return f"{name}@{h.hexdigest()[:24]}\n"


def _package(obj: Any) -> str:
    return (getattr(obj, "__module__", None) or "").split(".")[0]


def _outside(obj: Any) -> bool:
    """Library code the uuid does not follow: Python's own and torch's."""
    module = getattr(obj, "__module__", None) or ""
    return module in ("builtins", "abc", "typing") or module.split(".")[0] in ("torch", "functorch")


def _digest_object(obj: Any, h: Any, seen: set[int], package: str) -> None:
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, type):
        h.update(f"class {obj.__qualname__}\n".encode())
        for name in sorted(vars(obj)):
            member = vars(obj)[name]
            member = getattr(member, "__func__", member)  # staticmethod, classmethod
            if isinstance(member, property):
                member = member.fget
            if isinstance(member, types.FunctionType):
                h.update(f"def {name}\n".encode())
                _digest_object(member, h, seen, package)
            elif not name.startswith("__") and _is_simple(member):
                h.update(f"{name}={stable_text(member)}\n".encode())
        for base in obj.__bases__:
            if not _outside(base):
                _digest_object(base, h, seen, package)
        return
    code = getattr(obj, "__code__", None)
    if not isinstance(code, types.CodeType):
        h.update(f"opaque {getattr(obj, '__qualname__', type(obj).__name__)}\n".encode())
        return
    h.update(_code_digest(code).encode())
    defaults = getattr(obj, "__defaults__", None) or ()
    kwdefaults = getattr(obj, "__kwdefaults__", None) or {}
    for value in (*defaults, *(kwdefaults[k] for k in sorted(kwdefaults))):
        _digest_dependency(value, h, seen, package)
    for cell in getattr(obj, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        _digest_dependency(value, h, seen, package)
    namespace = getattr(obj, "__globals__", {})
    for name in _global_names(code):
        if name in namespace:
            h.update(f"global {name}\n".encode())
            _digest_dependency(namespace[name], h, seen, package)


def _digest_dependency(value: Any, h: Any, seen: set[int], package: str) -> None:
    """A global or closure value a pass's code reads: its code when it is code of the same
    package, its value when it is a simple constant, else only its name."""
    if isinstance(value, (types.FunctionType, type)):
        if _package(value) == package and not _outside(value):
            _digest_object(value, h, seen, package)
        else:
            h.update(f"ref {getattr(value, '__module__', '?')}.{value.__qualname__}\n".encode())
    elif _is_simple(value):
        h.update(stable_text(value).encode())
    elif isinstance(value, Pass):
        h.update(pass_uuid(value).encode())
    else:  # an object (a default argument, a helper instance): its class, not its state
        h.update(f"object {type(value).__module__}.{type(value).__qualname__}\n".encode())
        _digest_dependency(type(value), h, seen, package)


def _is_simple(value: Any) -> bool:
    return value is None or isinstance(
        value, (bool, int, float, str, bytes, tuple, frozenset, enum.Enum, torch.dtype)
    )


def _global_names(code: types.CodeType) -> Iterable[str]:
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _global_names(const)


@functools.lru_cache(maxsize=4096)
def _code_digest(code: types.CodeType) -> str:
    """The bytecode, names and constants of ``code`` (not its line numbers)."""
    h = hashlib.sha256(code.co_code)
    h.update(repr((code.co_names, code.co_varnames, code.co_argcount, code.co_flags)).encode())
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            h.update(_code_digest(const).encode())
        else:
            h.update(stable_text(const).encode())
    return h.hexdigest()[:24]


#: Packages (under fxpass/) whose files define fxpass's custom ops and the helpers their fake
#: kernels call. Fixed, not "whatever is registered now", so the id is the same in every
#: process whatever it has imported.
OP_PACKAGES = ("ops", "fxutil")


def ops_code_id(root: str | None = None, packages: Sequence[str] = OP_PACKAGES) -> str:
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


@functools.lru_cache(maxsize=512)
def _file_digest(path: str, mtime_ns: int, size: int) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()[:24]


# ----- values ---------------------------------------------------------------------------------
def _public_state(obj: Any, skip: tuple[str, ...] = ()) -> list[tuple[str, Any]]:
    state = getattr(obj, "__dict__", {})
    return sorted((k, v) for k, v in state.items() if not k.startswith("_") and k not in skip)


def stable_text(value: Any, depth: int = 0) -> str:
    """A text for ``value`` that is the same in every process (no addresses, no hash())."""
    if depth > 6:
        return "..."
    if value is None or isinstance(value, (bool, int, float, str, bytes)):
        return repr(value)
    if isinstance(value, enum.Enum):
        return f"{type(value).__qualname__}.{value.name}"
    if isinstance(value, (list, tuple)):
        inner = ",".join(stable_text(v, depth + 1) for v in value)
        return f"{type(value).__name__}[{inner}]"
    if isinstance(value, (set, frozenset)):
        return "set[" + ",".join(sorted(stable_text(v, depth + 1) for v in value)) + "]"
    if isinstance(value, dict):
        items = sorted(
            (stable_text(k, depth + 1), stable_text(v, depth + 1)) for k, v in value.items()
        )
        return "{" + ",".join(f"{k}:{v}" for k, v in items) + "}"
    if isinstance(value, (torch._ops.OpOverload, torch._ops.OpOverloadPacket, torch.dtype)):
        return str(value)
    if isinstance(value, torch.Tensor):
        return f"tensor{tuple(value.shape)}{value.dtype}"
    if isinstance(value, Pass):
        return f"pass:{pass_uuid(value)}"
    if isinstance(value, (types.FunctionType, types.MethodType, type, functools.partial)):
        return code_id(value)
    state = _public_state(value)
    return f"{type(value).__module__}.{type(value).__qualname__}({stable_text(state, depth + 1)})"


# ----- graphs ---------------------------------------------------------------------------------
def graph_hash(gm: fx.GraphModule, sample_inputs: Sequence[Any] | None = None) -> str:
    """A hex digest of ``gm``'s structure and of what its results depend on.

    Nodes by position (op, target, arguments, the shape/dtype/stride of ``meta['val']``),
    the content of every tensor the module holds, and the metadata of the sample inputs
    (their content too when they are real tensors: lowering passes may read them).
    """
    h = hashlib.sha256()
    _hash_module(gm, h)
    if sample_inputs is not None:
        h.update(b"inputs\n")
        for value in sample_inputs:
            h.update(_value_text(value, content=True).encode())
    return h.hexdigest()


def structure_hash(gm: fx.GraphModule) -> str:
    """:func:`graph_hash` without the nodes' fake values: what a saved graph must still be
    when it is loaded again (its fake values are made anew)."""
    h = hashlib.sha256()
    _hash_module(gm, h, values=False)
    return h.hexdigest()


def _hash_module(gm: fx.GraphModule, h: Any, values: bool = True) -> None:
    index: dict[fx.Node, int] = {}
    for i, node in enumerate(gm.graph.nodes):
        index[node] = i
        args = fx.node.map_arg((node.args, node.kwargs), lambda n: _NodeRef(index[n]))
        text = repr(args)  # plain data prints the same in every process ...
        if " at 0x" in text or " object>" in text:  # ... objects by address do not
            text = stable_text(args)
        line = f"{node.op}|{node.name}|{_target_text(node.target)}|{text}"
        if values:
            line += "|" + _value_text(node.meta.get("val", node.meta.get("example_value")))
        h.update(f"{line}\n".encode())
    for name, tensor in sorted(
        [*gm.named_parameters(remove_duplicate=False), *gm.named_buffers(remove_duplicate=False)],
        key=lambda item: item[0],
    ):
        h.update(f"tensor {name} {_value_text(tensor, content=True)}\n".encode())
    for name, value in sorted(vars(gm).items()):
        if isinstance(value, torch.Tensor):
            h.update(f"attr {name} {_value_text(value, content=True)}\n".encode())
    for name, child in gm.named_children():
        if isinstance(child, fx.GraphModule):
            h.update(f"module {name}\n".encode())
            _hash_module(child, h, values)


class UnhashableGraph(ValueError):
    """The graph holds something whose content cannot be hashed (so it cannot be cached)."""


class _NodeRef:
    __slots__ = ("i",)

    def __init__(self, i: int) -> None:
        self.i = i

    def __repr__(self) -> str:
        return f"%{self.i}"


def _target_text(target: Any) -> str:
    if isinstance(target, str):
        return target
    module = getattr(target, "__module__", None) or ""
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None)
    if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return str(target)
    return f"{module}.{name}" if name else repr(target)


def _value_text(value: Any, content: bool = False) -> str:
    if isinstance(value, (list, tuple)):
        return "(" + ",".join(_value_text(v, content) for v in value) + ")"
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return f"sym:{value.node.expr}"
    if not isinstance(value, torch.Tensor):
        return stable_text(value)
    from torch._subclasses.fake_tensor import is_fake

    sizes = ",".join(str(s) for s in value.shape)
    strides = ",".join(str(s) for s in value.stride())
    text = f"t[{sizes}|{strides}|{value.dtype}|{value.device.type}|{int(value.requires_grad)}]"
    if content and not is_fake(value) and value.device.type != "meta":
        text += ":" + _tensor_digest(value)
    return text


def _tensor_digest(t: torch.Tensor) -> str:
    try:
        data = t.detach()
        if data.is_quantized:
            data = data.dequantize()
        raw = data.contiguous().cpu().reshape(-1).view(torch.uint8)
        return hashlib.sha256(raw.numpy().tobytes()).hexdigest()[:24]
    except Exception as e:  # a layout without plain storage (sparse, nested)
        raise UnhashableGraph(
            f"cannot hash the content of a {t.layout} tensor ({type(e).__name__}: {e})"
        ) from None
