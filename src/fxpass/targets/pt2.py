"""Reading ``.pt2`` archives that ``torch.export.save`` wrote: checked, faithful, no code run.

:func:`load` is ``torch.export.load`` with four differences:

* **Integrity first.** Every member of the zip archive must pass its CRC-32, and every
  weight and constant must hold at least the bytes its shape, strides and dtype need
  (:func:`check_archive`); after loading, each one must have the shape and dtype the
  program's graph expects. A damaged file is refused with a :class:`Pt2Error` naming the
  member, before anything runs.
* **No pickles.** Tensors load with ``torch.load(weights_only=True)``; a file that needs
  anything else (pickled Python objects, which can run code) is refused. Contexts that name
  an enum load only when its module is already imported or the caller allowed it.
* **Types the process does not know.** A program whose inputs or outputs are pytree node
  types registered only by another package — a Hugging Face ``CausalLMOutputWithPast``
  (registered when ``transformers.modeling_outputs`` is imported), a user dataclass — loads
  anyway. With ``imports=["transformers"]`` the modules that define such types inside the
  allowed packages are imported, and the program returns the real type. Otherwise, and for
  anything still unknown, a :class:`StandIn` takes the type's place: a tuple of the values,
  also reachable by field name (``out.logits``, ``out["logits"]``) when the type has named
  fields; it keeps the serialized spec verbatim, so ``torch.export.save`` writes it back
  unchanged and the saved file loads wherever the original did.
* **The real cause.** When loading fails anyway, the error says why (an operator no
  library registered, a newer schema, ...) and what to do, instead of torch's "check the
  warnings above".
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import re
import sys
import types
import warnings
import zipfile
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch.export import ExportedProgram
from torch.utils import _pytree as pytree

from ..core.errors import FxpassError
from ..core.imports import import_modules, op_registrars
from ..fxutil.messages import error_summary

__all__ = ["Pt2Error", "StandIn", "check_archive", "load", "stand_in_types"]

_CHUNK = 1 << 20


class Pt2Error(FxpassError):
    """A ``.pt2`` file cannot be loaded: damaged, unsafe, or it needs something this process
    lacks. ``member`` names the archive member at fault, when there is one."""

    def __init__(self, message: str, *, member: str | None = None, unsafe: bool = False) -> None:
        super().__init__(message)
        self.member = member
        self.unsafe = unsafe


# ----- integrity ------------------------------------------------------------------------------
def check_archive(path: str | os.PathLike) -> None:
    """Refuse (:class:`Pt2Error`) an archive with a member that fails its checksum, or a
    weight or constant stored in fewer bytes than its shape, strides and dtype need.

    Reads every byte once (CRC-32 runs at disk speed)."""
    path = Path(path)
    if not zipfile.is_zipfile(path):
        with open(path, "rb") as f:
            head = f.read(4)
        if head == b"PK\x03\x04":
            raise Pt2Error(
                f"{path} is truncated: the zip directory at its end is missing (the file "
                f"is {path.stat().st_size} bytes; copy or save it again)"
            )
        raise Pt2Error(f"{path} is not a .pt2 archive (not a zip file)")
    try:
        with zipfile.ZipFile(path) as zf:
            infos = zf.infolist()
            for info in infos:
                _check_member(zf, info, path)
            for config in [i.filename for i in infos if i.filename.endswith("_config.json")]:
                _check_payload_sizes(zf, config, path)
    except zipfile.BadZipFile as e:
        raise Pt2Error(f"{path} is damaged: {e}") from e


def _check_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, path: Path) -> None:
    try:
        with zf.open(info) as f:  # zipfile checks the CRC-32 when it reaches the end
            while f.read(_CHUNK):
                pass
    except (zipfile.BadZipFile, EOFError, OSError, ValueError) as e:
        what = "fails its checksum" if "CRC" in str(e) else f"cannot be read ({e})"
        raise Pt2Error(
            f"{path} is damaged: member {info.filename} {what}; nothing was loaded",
            member=info.filename,
        ) from e


def _check_payload_sizes(zf: zipfile.ZipFile, config: str, path: Path) -> None:
    """Each weight / constant member holds the bytes its tensor metadata needs."""
    from torch._export.serde.schema import ScalarType
    from torch._export.serde.serialize import _SERIALIZE_TO_TORCH_DTYPE

    try:
        entries = json.loads(zf.read(config))["config"]
    except (ValueError, KeyError, TypeError) as e:
        raise Pt2Error(f"{path} is damaged: member {config} is not valid JSON ({e})") from e
    folder = config.rsplit("/", 1)[0]
    names = set(zf.namelist())
    for fqn, entry in entries.items():
        meta = entry.get("tensor_meta")
        if entry.get("use_pickle") or not meta:
            continue
        member = f"{folder}/{entry['path_name']}"
        if member not in names:
            raise Pt2Error(
                f"{path} is damaged: tensor '{fqn}' is stored in member {member}, which the "
                "archive does not have",
                member=member,
            )
        dtype = _SERIALIZE_TO_TORCH_DTYPE[ScalarType(meta["dtype"])]
        need = _bytes_needed(meta, dtype.itemsize)
        have = zf.getinfo(member).file_size
        if need is None:
            continue  # symbolic sizes: torch checks them when it builds the view
        if have < need or have % dtype.itemsize:
            shape = [s.get("as_int") for s in meta["sizes"]]
            raise Pt2Error(
                f"{path} is damaged: member {member} holds {have} bytes, but tensor '{fqn}' "
                f"({str(dtype).replace('torch.', '')} {shape}) needs {need}; nothing was loaded",
                member=member,
            )


def _bytes_needed(meta: dict[str, Any], itemsize: int) -> int | None:
    try:
        sizes = [int(s["as_int"]) for s in meta["sizes"]]
        strides = [int(s["as_int"]) for s in meta["strides"]]
        offset = int(meta.get("storage_offset", {"as_int": 0})["as_int"])
    except (KeyError, TypeError, ValueError):
        return None
    if any(s == 0 for s in sizes):
        return 0
    last = offset + sum((s - 1) * st for s, st in zip(sizes, strides))
    return (last + 1) * itemsize


def _check_against_graph(ep: ExportedProgram, path: Path) -> None:
    """Every parameter, buffer and constant has the shape and dtype the graph expects."""
    values = {**ep.state_dict, **ep.constants}
    placeholders = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    for spec in ep.graph_signature.input_specs:
        node = placeholders.get(getattr(spec.arg, "name", ""))
        value = values.get(spec.target) if spec.target is not None else None
        val = node.meta.get("val") if node is not None else None
        if not isinstance(value, torch.Tensor) or not isinstance(val, torch.Tensor):
            continue
        if tuple(value.shape) != tuple(val.shape) or value.dtype != val.dtype:
            raise Pt2Error(
                f"{path} is damaged: tensor '{spec.target}' is stored as "
                f"{_describe(value)}, but the program's graph expects {_describe(val)}; "
                "nothing was loaded"
            )


def _describe(t: torch.Tensor) -> str:
    return f"{str(t.dtype).replace('torch.', '')} {list(t.shape)}"


# ----- types the process does not know --------------------------------------------------------
class StandIn(tuple):
    """A value of a pytree node type this process does not know.

    The values in order (it is a tuple), and by field name when the type has named fields
    (``out.logits``, ``out["logits"]``, ``out.keys()``). ``type_name`` is the type's serialized
    name, e.g. ``transformers.modeling_outputs.CausalLMOutputWithPast``. Saving a program
    that returns one writes the original type name and context back unchanged.
    """

    type_name: ClassVar[str] = ""

    def __new__(cls, values: Iterable[Any], context: str = "null") -> StandIn:
        self = super().__new__(cls, values)
        self._context = context
        self._names = _field_names(context, len(self))
        return self

    def keys(self) -> tuple[str, ...]:
        """The field names (empty when the type's context does not name its fields)."""
        return self._names

    def __getattr__(self, name: str) -> Any:
        names = self.__dict__.get("_names", ())
        if name in names:
            return self[names.index(name)]
        raise AttributeError(
            f"{type(self).__name__} (a stand-in for {self.type_name}) has no field {name!r}"
            + (f"; its fields: {', '.join(names)}" if names else "")
        )

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            if key not in self._names:
                raise KeyError(key)
            key = self._names.index(key)
        return super().__getitem__(key)

    def __repr__(self) -> str:
        if self._names:
            body = ", ".join(f"{k}={v!r}" for k, v in zip(self._names, self))
        else:
            body = ", ".join(repr(v) for v in self)
        return f"{type(self).__name__}({body})"

    def __reduce__(self) -> Any:  # deepcopy / pickle: rebuild through the registered type
        return (_rebuild, (self.type_name, tuple(self), self._context))


def _rebuild(type_name: str, values: tuple, context: str) -> StandIn:
    return _stand_in_class(type_name)(values, context)


def _field_names(context: str, n: int) -> tuple[str, ...]:
    try:
        decoded = json.loads(context)
    except (TypeError, ValueError):
        return ()
    if isinstance(decoded, list) and len(decoded) == 2 and isinstance(decoded[0], list):
        decoded = decoded[0]  # register_dataclass: [field names, fields that were None]
    if (
        isinstance(decoded, list)
        and len(decoded) == n
        and all(isinstance(x, str) for x in decoded)
        and len(set(decoded)) == n
    ):
        return tuple(decoded)
    return ()


_STAND_INS: dict[str, type[StandIn]] = {}


def _stand_in_class(type_name: str) -> type[StandIn]:
    """The stand-in class for ``type_name``, made and registered with pytree once."""
    if type_name in _STAND_INS:
        return _STAND_INS[type_name]
    short = re.sub(r"\W", "_", type_name.rsplit(".", 1)[-1]) or "StandIn"
    cls = types.new_class(short, (StandIn,), exec_body=lambda ns: ns.update(type_name=type_name))
    cls.__module__ = __name__
    pytree.register_pytree_node(
        cls,
        lambda x: (list(x), x._context),
        lambda values, context: cls(values, context),
        serialized_type_name=type_name,
        to_dumpable_context=lambda context: context,  # kept verbatim: saved back unchanged
        from_dumpable_context=lambda text: text,
        flatten_with_keys_fn=_flatten_with_keys,
    )
    _STAND_INS[type_name] = cls
    return cls


def _flatten_with_keys(x: StandIn) -> tuple[list[tuple[Any, Any]], str]:
    if x._names:
        keys: list[Any] = [pytree.GetAttrKey(k) for k in x._names]
    else:
        keys = [pytree.SequenceKey(i) for i in range(len(x))]
    return list(zip(keys, x)), x._context


def _stand_in_namedtuple(type_name: str, fields: Sequence[str]) -> None:
    """A namedtuple registered under ``type_name`` with the fields the file recorded."""
    short = re.sub(r"\W", "_", type_name.rsplit(".", 1)[-1]) or "StandIn"
    cls = collections.namedtuple(short, list(fields))  # type: ignore[misc]
    cls.__module__ = __name__
    cls.type_name = type_name
    pytree._register_namedtuple(cls, serialized_type_name=type_name)
    _STAND_INS[type_name] = cls  # type: ignore[assignment]


def stand_in_types(ep: ExportedProgram) -> list[str]:
    """The serialized type names in ``ep``'s signature that are stand-ins (see :class:`StandIn`)."""
    found: list[str] = []

    def walk(spec: Any) -> None:
        if spec is None:
            return
        typ = spec.context if spec.type is collections.namedtuple else spec.type
        name = getattr(typ, "type_name", None)
        if name and _STAND_INS.get(name) is typ and name not in found:
            found.append(name)
        for child in spec.children():
            walk(child)

    for entry in ep.module_call_graph:
        if entry.signature is not None:
            walk(entry.signature.in_spec)
            walk(entry.signature.out_spec)
    return found


def _named_types(zf: zipfile.ZipFile) -> tuple[set[str], dict[str, list[str]]]:
    """Every pytree type name the archive's programs use, and the namedtuples' fields."""
    names: set[str] = set()
    namedtuples: dict[str, list[str]] = {}

    def walk(node: Any) -> None:
        if not isinstance(node, dict):
            return
        if node.get("type") == "collections.namedtuple":
            with contextlib.suppress(TypeError, ValueError):
                names.add("namedtuple:" + json.loads(node["context"]))
        elif node.get("type"):
            names.add(node["type"])
        for child in node.get("children_spec", ()):
            walk(child)

    for member in zf.namelist():
        if not re.search(r"(^|/)models/[^/]+\.json$", member):
            continue
        module = json.loads(zf.read(member)).get("graph_module", {})
        for entry in module.get("module_call_graph", ()):
            for key in ("in_spec", "out_spec"):
                text = (entry.get("signature") or {}).get(key)
                with contextlib.suppress(TypeError, ValueError, IndexError):
                    walk(json.loads(text)[1])
        for name, fields in (module.get("treespec_namedtuple_fields") or {}).items():
            namedtuples[name] = list(fields.get("field_names", ()))
    return names, namedtuples


def _allowed(module: str, allowed: Sequence[str]) -> bool:
    return any(module == a or module.startswith(a + ".") for a in allowed)


def _provide_types(path: Path, allowed: Sequence[str]) -> None:
    """Import the defining modules of unknown types inside ``allowed`` packages; give every
    type still unknown a stand-in."""
    with zipfile.ZipFile(path) as zf:
        names, namedtuples = _named_types(zf)
    known = pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE
    for raw in sorted(names):
        name = raw.removeprefix("namedtuple:")
        stand_in = _STAND_INS.get(name)
        if name in known and known[name] is not stand_in:
            continue
        module = name.rsplit(".", 1)[0]
        if "." in name and _allowed(module, allowed):
            try:
                import_modules([module])
            except Exception as e:
                raise Pt2Error(
                    f"cannot load {path}: it returns {name}, but importing {module} failed "
                    f"({type(e).__name__}: {e})"
                ) from e
        if name in known:
            continue  # the real type, or the stand-in made before
        if raw.startswith("namedtuple:"):
            _stand_in_namedtuple(name, namedtuples.get(name, ()))
        else:
            _stand_in_class(name)


# ----- loading without pickles ----------------------------------------------------------------
class _Refused(Exception):
    pass


@contextlib.contextmanager
def _no_pickle(allowed: Sequence[str]) -> Iterator[None]:
    """Close every path by which ``torch.export`` loading could unpickle objects or import
    modules the user did not allow."""
    from torch.export.pt2_archive import _package

    real_load, real_hook = torch.load, pytree.enum_object_hook

    def weights_only_load(f: Any, *args: Any, **kwargs: Any) -> Any:
        kwargs["weights_only"] = True
        return real_load(f, *args, **kwargs)

    def refuse(*_a: Any, **_k: Any) -> Any:
        raise _Refused("it holds pickled Python objects")

    def enum_hook(obj: dict[str, Any]) -> Any:
        if "__enum__" in obj:
            module = str(obj.get("fqn", "")).partition(":")[0]
            if module not in sys.modules and not _allowed(module, allowed):
                raise _Refused(f"it names an enum from module {module}, which is not imported")
        return real_hook(obj)

    saved = (torch.load, _package.pickle, torch._C._pickle_load_obj, pytree.enum_object_hook)
    torch.load = weights_only_load
    _package.pickle = types.SimpleNamespace(loads=refuse, load=refuse)
    torch._C._pickle_load_obj = refuse
    pytree.enum_object_hook = enum_hook
    try:
        yield
    finally:
        torch.load, _package.pickle, torch._C._pickle_load_obj, pytree.enum_object_hook = saved


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """torch logs tracebacks while it tries fallbacks; the caller reports one line instead."""
    previous = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(previous)


_UNKNOWN_OP = re.compile(r"resolve (torch\.ops\.[\w.]+?)(?:\.default)? to an operator")


def _cause(e: BaseException, path: Path, allowed: Sequence[str]) -> Pt2Error:
    """The one-line error for a load that failed: the real cause and what to do."""
    import pickle

    chain = [e]
    while chain[-1].__cause__ is not None or chain[-1].__context__ is not None:
        nxt = chain[-1].__cause__ or chain[-1].__context__
        if nxt in chain:
            break
        chain.append(nxt)
    text = "\n".join(str(x) for x in chain)
    for x in chain:
        if isinstance(x, _Refused):
            return Pt2Error(
                f"refusing to load {path}: {x}, which could run code; fxpass loads only plain "
                "tensors from .pt2 files",
                unsafe=True,
            )
        if isinstance(x, pickle.UnpicklingError):
            found = [ln.strip() for ln in str(x).splitlines() if "GLOBAL" in ln]
            what = f" ({found[0].rstrip('.')})" if found else ""
            return Pt2Error(
                f"refusing to load {path}: it holds pickled Python objects{what}, which could "
                "run code; fxpass loads only plain tensors from .pt2 files",
                unsafe=True,
            )
    op = _UNKNOWN_OP.search(text)
    if op:
        return Pt2Error(_unknown_op_line(path, op.group(1)))
    root = chain[-1]
    return Pt2Error(f"cannot load {path}: {error_summary(root)}")


def _unknown_op_line(path: Path, op: str) -> str:
    """What to do about ``torch.ops.ns.name``, which no loaded module registers: import the
    installed module whose source registers it (found by reading, not guessed)."""
    parts = op.removeprefix("torch.ops.").split(".")
    qualname = "::".join(parts[:2])
    head = f"cannot load {path}: the program calls {op}, which no loaded module registers"
    found = op_registrars(qualname) if len(parts) >= 2 else []
    if found:
        return (
            f"{head}; {found[0]} registers it (found in its source): import it first "
            f"(fxpass commands: --import {found[0]}, or FXPASS_IMPORT={found[0]})"
        )
    return (
        f"{head}, and no installed Python module's source registers {qualname} (a C++ "
        "extension? torch.ops.load_library loads it); import the module that defines it "
        "first (fxpass commands: --import MODULE)"
    )


def load(path: str | os.PathLike, *, imports: Sequence[str] = ()) -> ExportedProgram:
    """Load the ``.pt2`` file at ``path`` (see the module docstring); raises :class:`Pt2Error`.

    ``imports`` are modules to import first (they may register ops and pytree types); the
    modules inside those packages that define the types the program names are imported too,
    so ``imports=["transformers"]`` gives a Hugging Face model back its
    ``CausalLMOutputWithPast``.
    """
    from torch.export.pt2_archive._package import load_pt2

    path = Path(path)
    allowed = list(imports)
    check_archive(path)
    for module in allowed:
        try:
            import_modules([module])
        except Exception as e:
            raise Pt2Error(f"cannot import {module}: {type(e).__name__}: {e}") from e
    _provide_types(path, allowed)
    try:
        with _quiet(), _no_pickle(allowed):
            contents = load_pt2(str(path))
            if "model" not in contents.exported_programs:  # torch 2.7's layout
                ep = torch.export.load(str(path))
            else:
                ep = contents.exported_programs["model"]
    except Exception as e:
        raise _cause(e, path, allowed) from e
    _check_against_graph(ep, path)
    return ep
