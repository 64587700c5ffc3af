"""Cached pipelines: a pipeline's result kept on disk and restored without running the passes.

Expensive pipelines run again on every compile of the same model (AutoDeploy snapshots its
graph between stages for this; vLLM's pre-grad passes cost a second even when Inductor's
cache hits). :class:`PipelineCache` keeps the result of a run in a folder, under a key made
of everything that decides it:

* the input graph's structural hash (:func:`~fxpass.core.identity.graph_hash`: ops,
  arguments, shapes, the content of the tensors it holds) and the sample inputs;
* the pipeline's uuid (:func:`~fxpass.core.identity.pipeline_uuid`: each pass's code,
  options, requirements and ranges), the passes disabled in the registry, the compile
  range of the run;
* the versions of torch, fxpass and Python.

A second run with the same key puts the cached graph into the module (in place, as a run
would) and returns the report recorded when the passes ran, marked ``cached``. An entry is
trusted only after checks: its checksum, its key and versions, a safe load
(:mod:`fxpass.core.serialize` runs no code from the file), a structural hash of the loaded
graph against the one stored, its inputs against the module's, and ``graph.lint()``. A
corrupt or stale entry is ignored (the passes run and the entry is written again), and
the report says so.

>>> cache = PipelineCache("~/.cache/fxpass")                      # doctest: +SKIP
>>> fp.apply(program, "fuse_add_rmsnorm", cache=cache).report.cached   # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import fx

from ..fxutil.files import write_atomic
from ..fxutil.fx_internals import refill_graph
from ..fxutil.messages import error_summary, first_line
from ..fxutil.paths import find_path
from ..fxutil.values import fake_value, node_val, returns_alias, same_value
from .contract import Pass
from .identity import UnhashableGraph, graph_hash, pipeline_uuid, structure_hash
from .pass_registry import REGISTRY
from .pipeline import Pipeline
from .ranges import format_ranges
from .report import Report
from .serialize import GraphFileError, load_graph, save_graph
from .version import __version__

__all__ = ["CacheMiss", "PipelineCache", "ReportStore", "metadata_only", "replace_graph"]

FORMAT = "fxpass-pipeline-cache"
VERSION = 1


@dataclass
class CacheMiss:
    """Why a lookup did not restore anything (shown in the run's report notes)."""

    reason: str


class PipelineCache:
    """Pipeline results in the folder ``path`` (made on first write).

    ``key`` names a run, ``restore`` puts a cached result into a module, ``store`` keeps a
    result; targets call them (``fxpass.apply(..., cache=...)``, ``fxpass run --cache
    DIR``, ``fxpass.backend(..., cache=...)``).
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path).expanduser()
        if self.path.exists() and not self.path.is_dir():
            raise NotADirectoryError(f"the pipeline cache {self.path} is a file, not a folder")
        self.hits = 0
        self.misses = 0

    def __repr__(self) -> str:
        return f"PipelineCache({str(self.path)!r})"

    # ----- keys ------------------------------------------------------------------------------
    def key(
        self,
        pipeline: Pipeline,
        gm: fx.GraphModule,
        sample_inputs: Sequence[Any] | None = None,
        *,
        ranges: Any = None,
    ) -> str | CacheMiss:
        """The key of running ``pipeline`` on ``gm`` (a :class:`CacheMiss` when the run
        cannot be cached). Real sample-input tensors count by content (lowering passes and
        the weights of an ExportedProgram are read through them); fake ones by shape,
        dtype and strides — a target hands :func:`metadata_only` stand-ins for inputs
        whose content no pass can read."""
        try:
            graph = graph_hash(gm, sample_inputs)
        except UnhashableGraph as e:
            return CacheMiss(f"not cached: {e}")
        disabled = sorted({p.name for p in _tree(pipeline) if not REGISTRY.is_enabled(p.name)})
        parts = [
            f"{FORMAT} {VERSION}",
            f"torch {torch.__version__} fxpass {__version__} python {sys.version_info[:2]}",
            f"pipeline {pipeline_uuid(pipeline)}",
            f"graph {graph}",
            f"range {format_ranges(ranges) if ranges else '-'}",
            f"disabled {disabled}",
        ]
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()

    def _files(self, key: str) -> tuple[Path, Path]:
        return self.path / f"{key}.json", self.path / f"{key}.fxgraph"

    # ----- reading -----------------------------------------------------------------------
    def restore(self, key: str, gm: fx.GraphModule) -> tuple[Report, bool] | CacheMiss:
        """Put the result cached under ``key`` into ``gm``; returns ``(report, modified)``,
        or a :class:`CacheMiss` (``gm`` untouched) when there is none or it is not valid."""
        meta_file, graph_file = self._files(key)
        if not meta_file.exists():
            self.misses += 1
            return CacheMiss("")
        try:
            meta = _read_entry(meta_file, key)
            if meta["modified"]:
                data = graph_file.read_bytes()
                if hashlib.sha256(data).hexdigest() != meta["graph_sha256"]:
                    raise _Invalid("its graph file fails its checksum")
                mode = _fake_mode(gm)
                cached, _ = load_graph(graph_file, values=mode is None)
                if structure_hash(cached) != meta["structure"]:
                    raise _Invalid("its graph does not have the structure recorded with it")
                _check_inputs(cached, gm)
                cached.graph.lint()
                if mode is not None:
                    _revalue(cached, gm, mode)
        except (_Invalid, GraphFileError, OSError, KeyError, TypeError, ValueError) as e:
            self.misses += 1
            return CacheMiss(f"ignored the cache entry {meta_file.name}: {_why(e)}")
        if meta["modified"]:
            replace_graph(gm, cached)
            gm.recompile()
        self.hits += 1
        report = Report.from_dict(meta["report"])
        report.cached = f"the fxpass cache {self.path}"
        return report, bool(meta["modified"])

    # ----- writing -----------------------------------------------------------------------
    def store(self, key: str, gm: fx.GraphModule, report: Report, modified: bool) -> str | None:
        """Keep ``gm`` (the result) and ``report`` under ``key``; returns why it could not
        be kept, or None."""
        meta_file, graph_file = self._files(key)
        meta: dict[str, Any] = {
            "format": FORMAT,
            "version": VERSION,
            "key": key,
            "torch": str(torch.__version__),
            "fxpass": __version__,
            "modified": bool(modified),
            "report": report.to_dict(),
        }
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            if modified:
                save_graph(gm, graph_file)
                meta["graph_sha256"] = hashlib.sha256(graph_file.read_bytes()).hexdigest()
                meta["structure"] = structure_hash(gm)
            _write_json(meta_file, meta)
        except (GraphFileError, OSError) as e:
            return f"not cached: {_why(e)}"
        return None


class _Invalid(Exception):
    pass


def _why(e: BaseException) -> str:
    if isinstance(e, (_Invalid, GraphFileError)):  # its message says what is wrong
        return first_line(e) or type(e).__name__
    return error_summary(e)


def _read_entry(path: Path, key: str) -> dict[str, Any]:
    meta = _read_json(path)
    if meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise _Invalid("it is not an fxpass pipeline cache entry of this version")
    if meta.get("key") != key:
        raise _Invalid("it was stored under another key")
    if meta.get("torch") != str(torch.__version__) or meta.get("fxpass") != __version__:
        raise _Invalid(
            f"it was written by torch {meta.get('torch')} and fxpass {meta.get('fxpass')}"
        )
    return meta


def _read_checked(path: Path) -> Any:
    """What :func:`_write_json` wrote to ``path``, checked against its checksum."""
    raw = path.read_bytes()
    head, _, body = raw.partition(b"\n")
    if not head.startswith(b"sha256:") or hashlib.sha256(body).hexdigest() != head[7:].decode(
        errors="replace"
    ):
        raise _Invalid("it fails its checksum")
    try:
        return json.loads(body)
    except json.JSONDecodeError as e:
        raise _Invalid(f"it is not JSON ({e.msg})") from None


def _read_json(path: Path) -> dict[str, Any]:
    data = _read_checked(path)
    if not isinstance(data, dict):
        raise _Invalid("it is not a JSON object")
    return data


def _write_json(path: Path, data: Any) -> None:
    """``data`` as JSON after a checksum line; the file appears whole or not at all."""
    body = json.dumps(data, sort_keys=True).encode()
    payload = b"sha256:" + hashlib.sha256(body).hexdigest().encode() + b"\n" + body
    write_atomic(path, payload)


def _tree(p: Pass) -> list[Pass]:
    out = [p]
    if isinstance(p, Pipeline):
        for child in p.passes:
            out.extend(_tree(child))
    return out


def metadata_only(values: Sequence[Any] | None) -> list[Any] | None:
    """Real tensors as meta tensors of the same shape, dtype and strides: what stands for
    inputs whose content cannot decide a pipeline's result in a cache key."""
    if values is None:
        return None
    out = []
    for v in values:
        if isinstance(v, torch.Tensor) and not isinstance(v, torch._subclasses.FakeTensor):
            meta = torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="meta")
            v = meta.requires_grad_(v.requires_grad)
        out.append(v)
    return out


# ----- putting a cached graph into a module ------------------------------------------------
def _placeholders(gm: fx.GraphModule) -> list[fx.Node]:
    return list(gm.graph.find_nodes(op="placeholder"))


def _check_inputs(cached: fx.GraphModule, gm: fx.GraphModule) -> None:
    have = {n.name for n in _placeholders(gm)}
    new = [n.name for n in _placeholders(cached) if n.name not in have]
    if new:
        raise _Invalid(f"its graph reads inputs the module does not have: {', '.join(new)}")


def _fake_mode(gm: fx.GraphModule) -> Any:
    """The fake mode of ``gm``'s example values (None: it has none). Read from the values
    themselves: inside a compile the tracing context may hold another mode."""
    from torch._subclasses.fake_tensor import FakeTensor

    for node in gm.graph.nodes:
        val = node_val(node)
        for v in val if isinstance(val, (tuple, list)) else (val,):
            if isinstance(v, FakeTensor):
                return v.fake_mode
    return None


def _revalue(cached: fx.GraphModule, gm: fx.GraphModule, mode: Any) -> None:
    """Give the cached graph fake values in the module's fake mode (symbolic sizes
    included): a node that computes what the module's node of that name did takes its
    value; the others' are computed from their inputs' (a pass changes few nodes, so
    this costs far less than propagating through the whole graph)."""
    old = {n.name: n for n in gm.graph.nodes}
    dynamo = not any("val" in n.meta for n in old.values())  # Dynamo's graphs say example_value
    # export's and AOT's values were computed without autograd, Dynamo's with it
    grad = any(
        isinstance(v := node_val(n), torch.Tensor) and v.requires_grad
        for n in old.values()
        if n.op == "call_function"
    )
    with torch.set_grad_enabled(grad):
        _give_values(cached, old, mode, "example_value" if dynamo else "val")


def _give_values(cached: fx.GraphModule, old: dict[str, fx.Node], mode: Any, key: str) -> None:
    for node in cached.graph.nodes:
        if node.op == "output":
            continue
        before = old.get(node.name)
        if before is not None and _same_computation(node, before):
            node.meta.update(before.meta)  # the same computation: the same metadata
            continue
        if node.op == "placeholder":
            raise _Invalid(f"its input '{node.name}' differs from the module's")
        if node.op == "get_attr":
            value = find_path(cached, str(node.target))
            static = isinstance(value, torch.Tensor)
            val = mode.from_tensor(value, static_shapes=True) if static else None
        else:
            try:
                val = fake_value(
                    node.target, node.args, node.kwargs, mode=mode, strict=True,
                    method=node.op == "call_method",
                )  # fmt: skip
            except Exception as e:
                raise _Invalid(
                    f"its node '{node.name}' does not run on the module's fake values ({e})"
                ) from None
        node.meta.pop("val", None)
        node.meta.pop("example_value", None)
        if val is not None:
            node.meta[key] = val


def _same_computation(node: fx.Node, before: fx.Node) -> bool:
    """Whether ``node`` (its inputs already given values) computes what ``before`` did: the
    same op on inputs with the same values — the very same ones for ops whose result
    aliases an input (its fake value records which tensor it aliases)."""
    if node.op != before.op or node.target != before.target or node_val(before) is None:
        return False
    if node.op == "placeholder":
        return True
    mine: list[Any] = []
    theirs: list[Any] = []
    shape_a = fx.node.map_arg((node.args, node.kwargs), lambda n: mine.append(node_val(n)))
    shape_b = fx.node.map_arg((before.args, before.kwargs), lambda n: theirs.append(node_val(n)))
    if shape_a != shape_b or len(mine) != len(theirs):
        return False
    if all(a is b for a, b in zip(mine, theirs)):
        return True
    return not returns_alias(node.target) and all(
        a is not None and same_value(a, b) for a, b in zip(mine, theirs)
    )


def replace_graph(gm: fx.GraphModule, new: fx.GraphModule) -> None:
    """Make ``gm.graph`` hold ``new``'s nodes, and ``gm`` the tensors and modules they read.

    The graph object stays the same (Inductor keeps using it, and a GraphModule's users hold
    it); this is a restore, not a pass, so it edits the graph below the editor
    (:func:`~fxpass.fxutil.fx_internals.refill_graph`). The module's code is not regenerated (the
    caller does, when it runs the module)."""
    graph = gm.graph
    refill_graph(graph, new.graph)
    for node in graph.nodes:
        if node.op not in ("get_attr", "call_module"):
            continue
        target = str(node.target)
        value = find_path(new, target)
        current = find_path(gm, target)
        if value is not None and not _same_tensor(current, value):
            _set_path(gm, target, value, current)


def _set_path(gm: fx.GraphModule, target: str, value: Any, current: Any) -> None:
    prefix, _, name = target.rpartition(".")
    owner = find_path(gm, prefix) if prefix else gm
    if owner is None:
        owner = gm
        for part in prefix.split("."):
            if not hasattr(owner, part):
                owner.add_module(part, torch.nn.Module())
            owner = getattr(owner, part)
    if isinstance(current, torch.nn.Parameter) and not isinstance(value, torch.nn.Parameter):
        value = torch.nn.Parameter(value, requires_grad=current.requires_grad)
    setattr(owner, name, value)


def _same_tensor(a: Any, b: Any) -> bool:
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return a is b
    return (
        a.shape == b.shape
        and a.dtype == b.dtype
        and a.device == b.device
        and bool(torch.equal(a.detach(), b.detach()))
    )


class ReportStore:
    """Reports kept on disk by key, for results a cache serves without running fxpass: when
    Inductor's cache hits, its compile skips the passes, and the backend shows the reports
    recorded when they ran (``report.cached``)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path).expanduser()

    def save(self, key: str, reports: Sequence[Report]) -> None:
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            _write_json(self.path / f"{key}.json", [r.to_dict() for r in reports])
        except OSError:  # a read-only cache folder must not fail the compile
            return

    def load(self, key: str) -> list[Report] | None:
        """The reports under ``key``; None when there are none or they are damaged."""
        path = self.path / f"{key}.json"
        try:
            data = _read_checked(path)
            return [Report.from_dict(d) for d in data]
        except (_Invalid, OSError, ValueError, KeyError, TypeError):
            return None
