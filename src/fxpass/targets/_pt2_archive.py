"""A ``.pt2`` archive checked before torch reads it: one :class:`Pt2Error` line per fault.

:func:`read_archive` reads the zip file once and refuses, naming the member at fault:

* a file that is not a zip archive, or a truncated one; a member that fails its CRC-32;
  two members with one name; a member outside the archive's folder;
* compiled native code: anything under ``data/aotinductor/`` (an AOTInductor package, whose
  loading runs its shared library) and any shared library, object or GPU binary member;
* a JSON member torch parses (programs, weight and constant configs) that is not UTF-8, not
  JSON, nested too deep, or of the wrong shape where fxpass reads it;
* every expression string torch would hand to sympy or paste into Python (symbolic sizes,
  range constraints, guards) outside the grammar export writes, and every name or constant
  input that would change the Python source ``ep.module()`` generates (``_pt2_grammar``);
* a weight or constant stored in fewer bytes than its shape, strides and dtype need.
"""

from __future__ import annotations

import json
import os
import re
import zipfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.errors import FxpassError
from ._pt2_grammar import ExpressionError, guard_expression, program_names, sympy_expression

__all__ = ["Archive", "Pt2Error", "check_archive", "read_archive"]

_CHUNK = 1 << 20
AOTI_DIR = "data/aotinductor/"
#: Members whose bytes a loader could map as code: shared libraries, objects, GPU binaries.
_NATIVE = re.compile(r"\.(so(\.[0-9]+)*|dll|dylib|pyd|o|cubin|fatbin|hsaco|spv|ptx)$", re.I)
_MODEL = re.compile(r"models/([^/]+)\.json")
#: What torch's reader opens before any program (``.data/version`` by the zip reader itself).
_REQUIRED = ("archive_format", "archive_version", ".data/version")
_CONFIG = re.compile(r"data/(weights|constants)/[^/]+_config\.json")


class Pt2Error(FxpassError):
    """A ``.pt2`` file cannot be loaded: damaged, unsafe, or it needs something this process
    lacks. ``member`` names the archive member at fault, when there is one."""

    def __init__(self, message: str, *, member: str | None = None, unsafe: bool = False) -> None:
        super().__init__(message)
        self.member = member
        self.unsafe = unsafe


@dataclass
class Archive:
    """What :func:`read_archive` found: the members (without the archive's folder) and the
    programs' JSON, parsed."""

    path: Path
    folder: str
    names: list[str]
    programs: dict[str, Any] = field(default_factory=dict)  # models/NAME.json -> its JSON

    def member(self, name: str) -> str:
        """The full member name of ``name`` (``models/model.json`` -> ``tiny/models/...``)."""
        return f"{self.folder}/{name}" if self.folder else name


def check_archive(path: str | os.PathLike) -> None:
    """Refuse (:class:`Pt2Error`) an archive that is damaged or unsafe to hand to torch (see
    the module docstring). Reads every byte once (CRC-32 runs at disk speed)."""
    read_archive(path)


def read_archive(path: str | os.PathLike) -> Archive:
    """Check the archive at ``path`` (see the module docstring) and return what it holds."""
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
            return _read(zf, path)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError, ValueError) as e:
        raise Pt2Error(f"{path} is damaged: {type(e).__name__}: {_cap(str(e))}") from e


def _read(zf: zipfile.ZipFile, path: Path) -> Archive:
    infos = zf.infolist()
    if not infos:
        raise Pt2Error(f"{path} is an empty zip archive, not a .pt2 file")
    twice = [name for name, n in Counter(i.filename for i in infos).items() if n > 1]
    if twice:
        raise Pt2Error(
            f"{path} is damaged: member {twice[0]} appears {Counter(i.filename for i in infos)[twice[0]]} "
            "times (which one torch reads is undefined); save it again",
            member=twice[0],
        )
    folder = infos[0].filename.split("/", 1)[0] if "/" in infos[0].filename else ""
    names = []
    for info in infos:
        if folder and not info.filename.startswith(folder + "/"):
            raise Pt2Error(
                f"{path} is damaged: member {info.filename} is outside the archive's folder "
                f"{folder}/",
                member=info.filename,
            )
        names.append(info.filename[len(folder) + 1 :] if folder else info.filename)
    archive = Archive(path, folder, names)
    _refuse_native_code(archive)
    for needed in _REQUIRED:
        if needed not in names:
            raise Pt2Error(
                f"{path} is not an archive torch.export.save wrote: it lacks member "
                f"{archive.member(needed)}",
                member=archive.member(needed),
            )
    if not any(_MODEL.fullmatch(name) for name in names):
        raise Pt2Error(f"{path} holds no exported program (no member models/NAME.json)")
    for info in infos:
        _check_crc(zf, info, path)
    for name in names:
        if _MODEL.fullmatch(name):
            archive.programs[name] = _json_member(zf, archive, name)
            _check_program(archive, name)
        elif _CONFIG.fullmatch(name):
            _check_payload_config(zf, archive, name, _json_member(zf, archive, name))
        elif name.startswith("models/"):
            raise Pt2Error(
                f"{path} is damaged: member {archive.member(name)} is in models/ but is not "
                "a program's JSON (models/NAME.json)",
                member=archive.member(name),
            )
    return archive


def _cap(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."


def _refuse_native_code(archive: Archive) -> None:
    for name in archive.names:
        if name.startswith(AOTI_DIR):
            raise Pt2Error(
                f"refusing to load {archive.path}: it is an AOTInductor package (member "
                f"{archive.member(name)} is compiled code, which loading would run); fxpass "
                "loads exported programs only. If you trust the file, "
                "torch._inductor.aoti_load_package(path) loads it and runs its code",
                member=archive.member(name),
                unsafe=True,
            )
        if _NATIVE.search(name):
            raise Pt2Error(
                f"refusing to load {archive.path}: member {archive.member(name)} is compiled "
                "native code, which no exported program holds; fxpass never loads it",
                member=archive.member(name),
                unsafe=True,
            )


def _check_crc(zf: zipfile.ZipFile, info: zipfile.ZipInfo, path: Path) -> None:
    try:
        with zf.open(info) as f:  # zipfile checks the CRC-32 when it reaches the end
            while f.read(_CHUNK):
                pass
    except (zipfile.BadZipFile, EOFError, OSError, ValueError, NotImplementedError) as e:
        what = "fails its checksum" if "CRC" in str(e) else f"cannot be read ({_cap(str(e))})"
        raise Pt2Error(
            f"{path} is damaged: member {info.filename} {what}; nothing was loaded",
            member=info.filename,
        ) from e


def _json_member(zf: zipfile.ZipFile, archive: Archive, name: str) -> Any:
    member = archive.member(name)
    head = f"{archive.path} is damaged: member {member}"
    try:
        text = zf.read(member).decode("utf-8")
    except UnicodeDecodeError as e:
        raise Pt2Error(f"{head} is not UTF-8 text (byte {e.start})", member=member) from e
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise Pt2Error(f"{head} is not valid JSON ({e})", member=member) from e
    except RecursionError as e:
        raise Pt2Error(f"{head} is JSON nested too deep to read", member=member) from e


def _check_program(archive: Archive, name: str) -> None:
    """The program's JSON has the shape fxpass reads, and every expression in it is in the
    grammar export writes."""
    member = archive.member(name)
    program = archive.programs[name]

    def damaged(why: str) -> Pt2Error:
        return Pt2Error(f"{archive.path} is damaged: member {member} {why}", member=member)

    if not isinstance(program, dict) or not isinstance(program.get("graph_module"), dict):
        raise damaged("is not an exported program (no graph_module object)")
    model = _MODEL.fullmatch(name).group(1)  # type: ignore[union-attr]
    for needed, legacy in (
        (f"data/sample_inputs/{model}.pt", None),
        (f"data/weights/{model}_weights_config.json", f"data/weights/{model}.pt"),
        (f"data/constants/{model}_constants_config.json", f"data/constants/{model}.pt"),
    ):
        if needed not in archive.names and legacy not in archive.names:
            raise Pt2Error(
                f"{archive.path} is damaged: member {member} needs member "
                f"{archive.member(needed)}, which the archive lacks",
                member=archive.member(needed),
            )
    try:
        _check_expressions(program)
    except ExpressionError as e:
        raise _unsafe_expression(archive, member, e) from e
    except (TypeError, ValueError, AttributeError) as e:
        raise damaged(f"has a field of the wrong type ({e})") from e


def _unsafe_expression(archive: Archive, member: str, e: ExpressionError) -> Pt2Error:
    return Pt2Error(
        f"refusing to load {archive.path}: member {member}: {e}; export writes only symbols, "
        "integers, arithmetic, shape functions and plain names there, and anything else would "
        "run as Python",
        member=member,
        unsafe=True,
    )


def _check_expressions(program: dict[str, Any]) -> None:
    ranges = program.get("range_constraints") or {}
    if not isinstance(ranges, dict):
        raise TypeError(f"range_constraints is a {type(ranges).__name__}, not an object")
    for key, bounds in ranges.items():
        sympy_expression(key, "range constraint")
        if not isinstance(bounds, dict):
            raise TypeError(f"range constraint {key!r} is a {type(bounds).__name__}")
        for end in ("min_val", "max_val"):
            value = bounds.get(end)
            if not (value is None or type(value) is int or value in (float("inf"), -float("inf"))):
                raise TypeError(f"range constraint {key!r} has {end} {_cap(repr(value), 60)}")
    guards = program.get("guards_code") or []
    if not isinstance(guards, list):
        raise TypeError(f"guards_code is a {type(guards).__name__}, not a list")
    for guard in guards:
        guard_expression(guard, "guard")
    _check_symbolic(program)
    program_names(program)


def _check_symbolic(tree: Any) -> None:
    """Every ``expr_str``, wherever it sits: torch sympifies each one it reaches."""
    stack: list[Any] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if "expr_str" in node:
                sympy_expression(node["expr_str"], "symbolic expression")
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


def _check_payload_config(zf: zipfile.ZipFile, archive: Archive, name: str, config: Any) -> None:
    """Each weight / constant entry is well formed and its member holds the bytes its
    tensor metadata needs."""
    member = archive.member(name)
    head = f"{archive.path} is damaged: member {member}"
    entries = config.get("config") if isinstance(config, dict) else None
    if not isinstance(entries, dict):
        raise Pt2Error(f"{head} has no 'config' object", member=member)
    try:
        _check_symbolic(config)  # torch reads these sizes as integers; refused all the same
    except ExpressionError as e:
        raise _unsafe_expression(archive, member, e) from e
    folder = name.rsplit("/", 1)[0]
    for fqn, entry in entries.items():
        try:
            _check_payload(zf, archive, folder, fqn, entry)
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as e:
            raise Pt2Error(
                f"{head}: entry {_cap(repr(fqn), 60)} is malformed ({type(e).__name__}: "
                f"{_cap(str(e), 120)})",
                member=member,
            ) from e


def _check_payload(
    zf: zipfile.ZipFile, archive: Archive, folder: str, fqn: str, entry: Any
) -> None:
    from torch._export.serde.schema import ScalarType
    from torch._export.serde.serialize import _SERIALIZE_TO_TORCH_DTYPE

    if not isinstance(entry, dict) or not isinstance(entry.get("path_name"), str):
        raise TypeError("it is not an object with a path_name string")
    if not isinstance(entry.get("use_pickle", False), bool):
        raise TypeError("use_pickle is not true or false")
    meta = entry.get("tensor_meta")
    name = f"{folder}/{entry['path_name']}"
    if name not in archive.names:
        raise Pt2Error(
            f"{archive.path} is damaged: tensor {fqn!r} is stored in member "
            f"{archive.member(name)}, which the archive does not have",
            member=archive.member(name),
        )
    if entry.get("use_pickle") or meta is None:
        return
    if not isinstance(meta, dict):
        raise TypeError("tensor_meta is not an object")
    dtype = _SERIALIZE_TO_TORCH_DTYPE[ScalarType(meta["dtype"])]
    need = _bytes_needed(meta, dtype.itemsize)
    have = zf.getinfo(archive.member(name)).file_size
    if need is None:
        return  # symbolic sizes: torch checks them when it builds the view
    if have < need or have % dtype.itemsize:
        shape = [s.get("as_int") for s in meta["sizes"]]
        raise Pt2Error(
            f"{archive.path} is damaged: member {archive.member(name)} holds {have} bytes, but "
            f"tensor '{fqn}' ({str(dtype).replace('torch.', '')} {shape}) needs {need}; "
            "nothing was loaded",
            member=archive.member(name),
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
