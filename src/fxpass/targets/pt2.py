"""Reading ``.pt2`` archives that ``torch.export.save`` wrote: checked, faithful, no code run.

:func:`load` is ``torch.export.load`` with these differences:

* **Checked before torch reads it** (``_pt2_archive``). Every member must pass its CRC-32,
  appear once, sit in the archive's folder; every weight and constant must hold the bytes
  its shape, strides and dtype need (after loading, also the shape and dtype the graph
  expects); the JSON torch parses must be UTF-8 JSON of a readable depth. A damaged file is
  refused with a :class:`Pt2Error` naming the member, before anything runs.
* **No code from the file runs.** Every string torch would evaluate (symbolic sizes and
  values, which torch hands to ``sympy.sympify``; range-constraint names; guards, which
  ``ep.module()`` pastes into Python) must be in the grammar export writes
  (``_pt2_grammar``); AOTInductor packages and native-code members are refused, never
  dlopen'ed. Tensors load with ``torch.load(weights_only=True)``; a file that needs anything
  else (pickled Python objects, which can run code) is refused. Contexts that name an enum
  load only when its module is already imported or the caller allowed it.
* **One line per fault.** Whatever torch itself then trips on in a malformed file becomes a
  :class:`Pt2Error` naming the member it was reading, never another exception.
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
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch.export import ExportedProgram
from torch.utils import _pytree as pytree

from ..core.imports import import_modules, op_registrars
from ..fxutil.messages import error_summary
from ._pt2_archive import Archive, Pt2Error, check_archive, read_archive

__all__ = ["Pt2Error", "StandIn", "check_archive", "load", "quiet", "stand_in_types"]


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


_UNQUOTABLE = re.compile(r"[\x00-\x1f\x7f\"\\]")


def _check_example_inputs(ep: ExportedProgram, archive: Archive) -> None:
    """The sample inputs' keys are plain: ``ep.module()`` writes each input's path
    (``d['key']``) into the Python source of its guards, inside a string literal."""
    member = archive.member("data/sample_inputs/model.pt")
    try:
        paths = [pytree.keystr(p) for p, _ in pytree.tree_leaves_with_path(ep.example_inputs)]
    except (RecursionError, TypeError, ValueError) as e:
        raise Pt2Error(
            f"{archive.path} is damaged: member {member}: the sample inputs cannot be walked "
            f"({error_summary(e)})",
            member=member,
        ) from e
    for text in paths:
        if _UNQUOTABLE.search(text):
            shown = text if len(text) <= 80 else text[:80] + "..."
            raise Pt2Error(
                f"refusing to load {archive.path}: member {member}: the sample input at "
                f"{shown!r} has a key with a quote, backslash or control character, which "
                "ep.module() would write into Python source",
                member=member,
                unsafe=True,
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


def _named_types(archive: Archive) -> tuple[set[str], dict[str, list[str]]]:
    """Every pytree type name the archive's programs use, and the namedtuples' fields
    (a field of an unexpected type is skipped here: torch's own reading reports it)."""
    names: set[str] = set()
    namedtuples: dict[str, list[str]] = {}
    for program in archive.programs.values():
        module = program.get("graph_module", {})
        specs: list[Any] = []
        entries = module.get("module_call_graph")
        for entry in entries if isinstance(entries, list) else ():
            signature = entry.get("signature") if isinstance(entry, dict) else None
            for key in ("in_spec", "out_spec"):
                text = signature.get(key) if isinstance(signature, dict) else None
                with contextlib.suppress(TypeError, ValueError, IndexError, RecursionError):
                    specs.append(json.loads(text)[1])
        while specs:  # no recursion: a deep spec is torch's to refuse, not a crash here
            node = specs.pop()
            if not isinstance(node, dict):
                continue
            if node.get("type") == "collections.namedtuple":
                context = node.get("context")  # the type's name, plain or JSON-quoted
                with contextlib.suppress(TypeError, ValueError, RecursionError):
                    context = json.loads(context)
                if isinstance(context, str) and context:
                    names.add("namedtuple:" + context)
            elif isinstance(node.get("type"), str) and node["type"]:
                names.add(node["type"])
            children = node.get("children_spec", ())
            specs.extend(children if isinstance(children, list) else ())
        fields = module.get("treespec_namedtuple_fields")
        for name, value in (fields if isinstance(fields, dict) else {}).items():
            field_names = value.get("field_names", ()) if isinstance(value, dict) else ()
            if isinstance(field_names, list) and all(isinstance(f, str) for f in field_names):
                namedtuples[name] = field_names
    return names, namedtuples


def _allowed(module: str, allowed: Sequence[str]) -> bool:
    return any(module == a or module.startswith(a + ".") for a in allowed)


def _provide_types(archive: Archive, allowed: Sequence[str]) -> None:
    """Import the defining modules of unknown types inside ``allowed`` packages; give every
    type still unknown a stand-in."""
    path = archive.path
    names, namedtuples = _named_types(archive)
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
def quiet() -> Iterator[None]:
    """Silence torch's logs and warnings inside the block: torch logs tracebacks while it
    tries fallbacks, and the caller reports one line instead."""
    previous = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(previous)


_UNKNOWN_OP = re.compile(r"resolve (torch\.ops\.[\w.]+?)(?:\.default)? to an operator")


class _Reading:
    """Which member of the archive torch was reading, for the error when it fails."""

    def __init__(self, archive: Archive) -> None:
        self.archive = archive
        self.name: str | None = None
        self.read: dict[int, tuple[str, bytes]] = {}  # id(bytes torch read) -> member, bytes

    @property
    def member(self) -> str | None:
        return self.archive.member(self.name) if self.name else None


@contextlib.contextmanager
def _reading(archive: Archive) -> Iterator[_Reading]:
    """Follow torch's reading of ``archive``: each member it reads, the program's JSON once
    its tensors are read, and the sample inputs while they are unpickled."""
    from torch._export.serde import serialize
    from torch.export.pt2_archive import _package

    reading = _Reading(archive)
    reader = _package.PT2ArchiveReader
    saved = (reader.read_bytes, _package._load_constants, serialize.deserialize_torch_artifact)
    real_bytes, real_constants, real_artifact = saved

    def read_bytes(self: Any, name: str) -> bytes:
        reading.name = name
        data = real_bytes(self, name)
        reading.read[id(data)] = (name, data)
        return data

    def load_constants(archive_reader: Any, model_name: str) -> Any:
        constants = real_constants(archive_reader, model_name)
        reading.name = f"models/{model_name}.json"  # what torch deserializes next
        return constants

    def deserialize_artifact(serialized: Any) -> Any:
        found = reading.read.get(id(serialized))
        if found is None or found[1] is not serialized:
            return real_artifact(serialized)
        previous, reading.name = reading.name, found[0]
        result = real_artifact(serialized)
        reading.name = previous
        return result

    reader.read_bytes = read_bytes  # type: ignore[method-assign]
    _package._load_constants = load_constants
    serialize.deserialize_torch_artifact = deserialize_artifact
    try:
        yield reading
    finally:
        reader.read_bytes, _package._load_constants, serialize.deserialize_torch_artifact = saved


def _cause(
    e: BaseException, path: Path, allowed: Sequence[str], member: str | None = None
) -> Pt2Error:
    """The one-line error for a load that failed: the member torch was reading, the real
    cause and what to do."""
    import pickle

    chain = [e]
    while chain[-1].__cause__ is not None or chain[-1].__context__ is not None:
        nxt = chain[-1].__cause__ or chain[-1].__context__
        if nxt in chain:
            break
        chain.append(nxt)
    text = "\n".join(str(x) for x in chain)
    where = f"member {member}: " if member else ""
    for x in chain:
        if isinstance(x, _Refused):
            return Pt2Error(
                f"refusing to load {path}: {where}{x}, which could run code; fxpass loads only "
                "plain tensors from .pt2 files",
                member=member,
                unsafe=True,
            )
        if isinstance(x, pickle.UnpicklingError):
            found = [ln.strip() for ln in str(x).splitlines() if "GLOBAL" in ln]
            what = f" ({found[0].rstrip('.')})" if found else ""
            return Pt2Error(
                f"refusing to load {path}: {where}it holds pickled Python objects{what}, which "
                "could run code; fxpass loads only plain tensors from .pt2 files",
                member=member,
                unsafe=True,
            )
    op = _UNKNOWN_OP.search(text)
    if op:
        return Pt2Error(_unknown_op_line(path, op.group(1)))
    root = chain[-1]
    if member:
        return Pt2Error(
            f"cannot load {path}: reading member {member} failed: {error_summary(root)}",
            member=member,
        )
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
    archive = read_archive(path)
    for module in allowed:
        try:
            import_modules([module])
        except Exception as e:
            raise Pt2Error(f"cannot import {module}: {type(e).__name__}: {e}") from e
    try:
        _provide_types(archive, allowed)
    except Pt2Error:
        raise
    except Exception as e:  # a type name or field list fxpass cannot stand in for: one line
        program = next(iter(archive.programs), None)
        raise _cause(e, path, allowed, archive.member(program) if program else None) from e
    reading: _Reading | None = None
    try:
        with quiet(), _no_pickle(allowed), _reading(archive) as reading:
            contents = load_pt2(str(path))
            if "model" not in contents.exported_programs:  # torch 2.7's layout
                ep = torch.export.load(str(path))
            else:
                ep = contents.exported_programs["model"]
    except Exception as e:  # any fault of a malformed archive: one line naming its member
        raise _cause(e, path, allowed, reading.member if reading else None) from e
    _check_against_graph(ep, path)
    _check_example_inputs(ep, archive)
    return ep
