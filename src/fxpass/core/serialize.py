"""A safe file format for FX graphs: ``.fxgraph``.

``save_graph(gm, path, sample_inputs)`` writes the graph (nodes, arguments, targets by name,
metadata such as ``meta['val']`` as shape/dtype/stride, ``stack_trace``, ``nn_module_stack``,
provenance), the tensors it reads through ``get_attr`` and optional sample inputs.
``load_graph(path)`` rebuilds an equivalent GraphModule — same node names, same code, fake
tensor values in ``meta['val']`` — and the sample inputs.

Loading never runs code from the file: it is read with ``torch.load(weights_only=True)``
(tensors, numbers, strings and containers only) and call targets are resolved by name from
``torch.ops`` and an allow-list of modules (``torch``, ``operator``, ``math``, ``builtins``).

The crash reproducer writes its input graph in this format, and the ``fxpass`` command reads
it as a target.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import fx
from torch._subclasses.fake_tensor import FakeTensorMode

from ..edit.editor import Editor
from ..fxutil.files import write_atomic
from ..fxutil.fx_internals import make_lazy_module, module_tables, pytree_info, set_pytree_info
from .errors import FxpassError

__all__ = ["GraphFileError", "load_graph", "save_graph"]

FORMAT = "fxpass-graph"
VERSION = 1
_SAFE_MODULE_ROOTS = ("torch", "operator", "_operator", "math", "builtins")
_KEPT_META = ("stack_trace", "nn_module_stack", "source_fn_stack", "torch_fn", "seq_nr",
              "fxpass_provenance", "custom")  # fmt: skip


class GraphFileError(FxpassError):
    """A graph cannot be written to, or read from, an ``.fxgraph`` file."""


# ----- targets --------------------------------------------------------------------------------
def _encode_target(target: Any) -> Any:
    if isinstance(target, str):
        return target
    if isinstance(target, torch._ops.OpOverload):
        return {"op": target.name()}
    if isinstance(target, torch._ops.OpOverloadPacket):
        return {"packet": target._qualified_op_name}
    if isinstance(target, torch._ops.HigherOrderOperator):
        return {"hop": target.name()}
    module = getattr(target, "__module__", None) or ""
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None)
    # C functions of torch's namespace (torch.conv2d) give a class as their qualname
    short = getattr(target, "__name__", None)
    if module.split(".")[0] in _SAFE_MODULE_ROOTS:
        for ref in dict.fromkeys(f"{module}:{n}" for n in (name, short) if n):
            try:
                if _resolve_callable(ref) is target:
                    return {"py": ref}
            except Exception:  # broad: not this name; the error below says what can be saved
                pass
    raise GraphFileError(
        f"cannot save a call to {target!r}: only torch ops and functions from torch, operator, "
        "math and builtins can be saved; export the model (torch.export) to get an ATen graph"
    )


def _resolve_callable(ref: str) -> Any:
    module_name, _, qualname = ref.partition(":")
    if module_name.split(".")[0] not in _SAFE_MODULE_ROOTS:
        raise GraphFileError(f"refusing to load '{ref}': not a torch, operator or math function")
    obj: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _decode_target(data: Any) -> Any:
    if isinstance(data, str):
        return data
    if "op" in data:
        ns, _, rest = data["op"].partition("::")
        name, _, overload = rest.partition(".")
        packet = getattr(getattr(torch.ops, ns), name)
        return getattr(packet, overload or "default")
    if "packet" in data:
        ns, _, name = data["packet"].partition("::")
        return getattr(getattr(torch.ops, ns), name)
    if "hop" in data:
        return getattr(torch.ops.higher_order, data["hop"])
    if "py" in data:
        return _resolve_callable(data["py"])
    raise GraphFileError(f"unknown target encoding {data!r}")


# ----- values ---------------------------------------------------------------------------------
class _Encoder:
    def __init__(self) -> None:
        self.tensors: dict[str, torch.Tensor] = {}

    def tensor(self, t: torch.Tensor) -> dict:
        key = f"t{len(self.tensors)}"
        self.tensors[key] = t.detach()
        return {"tensor": key}

    def value(self, v: Any) -> Any:
        if v is None or isinstance(v, (bool, str)):
            return v
        if isinstance(v, int):
            return v
        if isinstance(v, float):
            return v if math.isfinite(v) else {"float": repr(v)}
        if isinstance(v, fx.Node):
            return {"node": v.name}
        if isinstance(v, torch.Size):
            return {"size": [self.value(x) for x in v]}
        if isinstance(v, tuple):
            return {"tuple": [self.value(x) for x in v]}
        if isinstance(v, list):
            return {"list": [self.value(x) for x in v]}
        if isinstance(v, dict):
            return {"dict": [[k, self.value(x)] for k, x in v.items()]}
        if isinstance(v, torch.dtype):
            return {"dtype": str(v).removeprefix("torch.")}
        if isinstance(v, torch.device):
            return {"device": str(v)}
        if isinstance(v, torch.layout):
            return {"layout": str(v).removeprefix("torch.")}
        if isinstance(v, torch.memory_format):
            return {"memory_format": str(v).removeprefix("torch.")}
        if isinstance(v, slice):
            return {"slice": [self.value(v.start), self.value(v.stop), self.value(v.step)]}
        if v is Ellipsis:
            return {"ellipsis": True}
        if isinstance(v, torch.Tensor):
            return self.tensor(v)
        if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            raise GraphFileError("graphs with symbolic (dynamic) shapes cannot be saved yet")
        raise GraphFileError(f"cannot save an argument of type {type(v).__name__}: {v!r}")


def _decode_value(v: Any, nodes: dict[str, fx.Node], tensors: dict[str, torch.Tensor]) -> Any:
    if not isinstance(v, dict):
        return v
    ((kind, data),) = v.items()
    rec = lambda x: _decode_value(x, nodes, tensors)  # noqa: E731
    if kind == "node":
        return nodes[data]
    if kind == "tuple":
        return tuple(rec(x) for x in data)
    if kind == "list":
        return [rec(x) for x in data]
    if kind == "size":
        return torch.Size([rec(x) for x in data])
    if kind == "dict":
        return {k: rec(x) for k, x in data}
    if kind == "float":
        return float(data)
    if kind == "dtype":
        return getattr(torch, data)
    if kind == "device":
        return torch.device(data)
    if kind in ("layout", "memory_format"):
        return getattr(torch, data)
    if kind == "slice":
        return slice(*(rec(x) for x in data))
    if kind == "ellipsis":
        return Ellipsis
    if kind == "tensor":
        return tensors[data]
    raise GraphFileError(f"unknown value encoding {kind!r}")


def _encode_val(v: Any) -> Any:
    if isinstance(v, torch.Tensor) and _symbolic(v):
        return None  # int() of a symbolic size would add a guard; the reader makes it anew
    if isinstance(v, torch.Tensor):
        return {
            "fake": {
                "shape": [int(s) for s in v.shape],
                "stride": [int(s) for s in v.stride()],
                "dtype": str(v.dtype).removeprefix("torch."),
                "device": str(v.device),
                "offset": int(v.storage_offset()),
            }
        }
    if isinstance(v, (tuple, list)):
        return {"list" if isinstance(v, list) else "tuple": [_encode_val(x) for x in v]}
    if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return None
    if v is None or isinstance(v, (bool, int, float)):
        return v
    return None


def _symbolic(t: torch.Tensor) -> bool:
    return any(isinstance(s, torch.SymInt) for s in (*t.shape, *t.stride(), t.storage_offset()))


def _decode_val(v: Any, mode: FakeTensorMode) -> Any:
    if not isinstance(v, dict):
        return v
    if "fake" in v:
        f = v["fake"]
        with mode:
            return torch.empty_strided(
                f["shape"], f["stride"], dtype=getattr(torch, f["dtype"]), device=f["device"]
            )
    key = "list" if "list" in v else "tuple"
    items = [_decode_val(x, mode) for x in v[key]]
    return items if key == "list" else tuple(items)


def _jsonable(v: Any) -> Any:
    """Metadata as JSON: classes and functions become their qualified names."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, type) or callable(v):
        return f"{getattr(v, '__module__', '')}.{getattr(v, '__qualname__', repr(v))}"
    return repr(v)


# ----- graphs ---------------------------------------------------------------------------------
def _encode_graph(gm: fx.GraphModule, enc: _Encoder, prefix: str = "") -> dict:
    nodes = []
    attrs: dict[str, Any] = {}
    for node in gm.graph.nodes:
        if node.op == "call_module":
            sub = gm.get_submodule(node.target)
            if not isinstance(sub, fx.GraphModule):
                raise GraphFileError(
                    f"cannot save node '{node.name}': it calls module '{node.target}' "
                    f"({type(sub).__name__}); only GraphModule submodules can be saved"
                )
        if node.op in ("get_attr", "call_module") and node.target not in attrs:
            attrs[node.target] = _encode_attr(gm, node.target, enc, prefix)
        meta = {k: _jsonable(node.meta[k]) for k in _KEPT_META if k in node.meta}
        if "from_node" in node.meta:
            meta["from_node"] = [
                s.to_dict() for s in node.meta["from_node"] if hasattr(s, "to_dict")
            ]
        entry = {
            "name": node.name,
            "op": node.op,
            "target": _encode_target(node.target),
            "args": enc.value(node.args),
            "kwargs": enc.value(node.kwargs),
            "meta": meta,
        }
        if "val" in node.meta:
            entry["val"] = _encode_val(node.meta["val"])
        if node.type is not None:
            # an annotation fxpass cannot name is only lost from the printed code
            with contextlib.suppress(GraphFileError):
                entry["type"] = _encode_target(node.type)
        nodes.append(entry)
    pytree = None
    if (info := pytree_info(gm.graph)) is not None:
        pytree = {
            "orig_args": list(info.orig_args),
            "in_spec": torch.utils._pytree.treespec_dumps(info.in_spec) if info.in_spec else None,
            "out_spec": (
                torch.utils._pytree.treespec_dumps(info.out_spec) if info.out_spec else None
            ),
        }
    return {"nodes": nodes, "attrs": attrs, "pytree": pytree}


def _encode_attr(gm: fx.GraphModule, target: str, enc: _Encoder, prefix: str) -> dict:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    if isinstance(obj, fx.GraphModule):
        return {"graph": _encode_graph(obj, enc, f"{prefix}{target}.")}
    if isinstance(obj, torch.Tensor):
        kind = "parameter" if isinstance(obj, torch.nn.Parameter) else "tensor"
        if kind == "tensor" and _is_buffer(gm, target):
            kind = "buffer"
        return {kind: enc.tensor(obj)["tensor"], "requires_grad": bool(obj.requires_grad)}
    if isinstance(obj, torch.ScriptObject):
        raise GraphFileError(f"cannot save attribute '{target}': script objects are not supported")
    raise GraphFileError(f"cannot save attribute '{target}' of type {type(obj).__name__}")


def _is_buffer(gm: torch.nn.Module, target: str) -> bool:
    owner_path, _, name = target.rpartition(".")
    owner = gm.get_submodule(owner_path) if owner_path else gm
    return name in module_tables(owner)[2]


def _decode_graph(data: dict, tensors: dict[str, torch.Tensor], mode: FakeTensorMode | None):
    root = torch.nn.Module()
    for target, attr in data["attrs"].items():
        if "graph" in attr:
            value: Any = _decode_graph(attr["graph"], tensors, mode)
        else:
            kind = next(k for k in ("parameter", "buffer", "tensor") if k in attr)
            value = tensors[attr[kind]]
            if kind == "parameter":
                value = torch.nn.Parameter(value, requires_grad=attr["requires_grad"])
        _set_attr(root, target, value, is_buffer="buffer" in attr)
    graph = fx.Graph()
    builder = Editor(None)  # a graph read back from a file: no run watches it yet
    nodes: dict[str, fx.Node] = {}
    for entry in data["nodes"]:
        args = _decode_value(entry["args"], nodes, tensors)
        kwargs = _decode_value(entry["kwargs"], nodes, tensors)
        node = builder.create(
            graph,
            entry["op"],
            _decode_target(entry["target"]),
            tuple(args),
            dict(kwargs),
            name=entry["name"],
            type_expr=_decode_target(entry["type"]) if "type" in entry else None,
        )
        if node.name != entry["name"]:
            raise GraphFileError(f"node name '{entry['name']}' could not be restored")
        node.meta.update(_decode_meta(entry["meta"]))
        if "val" in entry and mode is not None:
            node.meta["val"] = _decode_val(entry["val"], mode)
        nodes[node.name] = node
    if data.get("pytree"):
        p = data["pytree"]
        load = torch.utils._pytree.treespec_loads
        set_pytree_info(
            graph,
            p["orig_args"],
            load(p["in_spec"]) if p["in_spec"] else None,
            load(p["out_spec"]) if p["out_spec"] else None,
        )
    return make_lazy_module(root, graph)  # its code is made when it first runs


def _decode_meta(meta: dict) -> dict:
    out = dict(meta)
    if "nn_module_stack" in out:
        out["nn_module_stack"] = {k: tuple(v) for k, v in out["nn_module_stack"].items()}
    if "source_fn_stack" in out:
        out["source_fn_stack"] = [tuple(x) for x in out["source_fn_stack"]]
    if "torch_fn" in out:
        out["torch_fn"] = tuple(out["torch_fn"])
    if "from_node" in out:
        from torch.fx.traceback import NodeSource

        loader = getattr(NodeSource, "_from_dict", None)
        out["from_node"] = [loader(d) for d in out["from_node"]] if loader else []
    return out


def _set_attr(root: torch.nn.Module, target: str, value: Any, *, is_buffer: bool) -> None:
    *path, name = target.split(".")
    owner = root
    for part in path:
        if not hasattr(owner, part):
            owner.add_module(part, torch.nn.Module())
        owner = getattr(owner, part)
    if is_buffer:
        owner.register_buffer(name, value)
    else:
        setattr(owner, name, value)


# ----- files ----------------------------------------------------------------------------------
def save_graph(
    gm: fx.GraphModule, path: str | os.PathLike, sample_inputs: Sequence[Any] | None = None
) -> Path:
    """Write ``gm`` (and ``sample_inputs``) to ``path``; the file appears whole or not at all."""
    if not isinstance(gm, fx.GraphModule):
        raise GraphFileError(f"save_graph expects a torch.fx.GraphModule, got {type(gm).__name__}")
    enc = _Encoder()
    graph = _encode_graph(gm, enc)
    inputs = None
    if sample_inputs is not None:
        inputs = enc.value(list(sample_inputs))
    payload = {
        "format": FORMAT,
        "version": VERSION,
        "torch": str(torch.__version__),
        "graph": json.dumps(graph),
        "inputs": json.dumps(inputs),
        "tensors": enc.tensors,
    }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_atomic(path, lambda tmp: torch.save(payload, tmp))


def load_graph(
    path: str | os.PathLike, *, values: bool = True
) -> tuple[fx.GraphModule, list[Any] | None]:
    """Read an ``.fxgraph`` file: ``(graph_module, sample_inputs or None)``. Runs no code.

    ``values=False`` leaves out the nodes' fake values (``meta['val']``), for a caller that
    gives them values of its own (a pipeline cache restoring into a traced module)."""
    path = Path(path)
    if not path.is_file():
        raise GraphFileError(f"no such graph file: {path}")
    try:
        payload = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as e:
        raise GraphFileError(
            f"{path} is not an fxpass graph file, or it is damaged ({type(e).__name__})"
        ) from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise GraphFileError(f"{path} is not an fxpass graph file (no '{FORMAT}' header)")
    if payload.get("version", 0) > VERSION:
        raise GraphFileError(
            f"{path} was written by a newer fxpass (format version {payload['version']}); "
            "upgrade fxpass to read it"
        )
    try:
        tensors = payload["tensors"]
        mode = FakeTensorMode(allow_non_fake_inputs=True) if values else None
        gm = _decode_graph(json.loads(payload["graph"]), tensors, mode)
        raw_inputs = json.loads(payload["inputs"])
        inputs = _decode_value(raw_inputs, {}, tensors) if raw_inputs is not None else None
    except GraphFileError:
        raise
    except Exception as e:
        raise GraphFileError(
            f"{path} is damaged or from an incompatible version: {type(e).__name__}: {e}"
        ) from None
    return gm, inputs
