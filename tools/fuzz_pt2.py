"""Structured mutations of ``.pt2`` archives, and the property every mutant must keep.

The interface ``tools/fuzz.py`` and ``tests/targets/test_pt2_fuzz.py`` use:

``mutate_pt2(data: bytes, rng: random.Random) -> bytes``
    One mutant of the archive ``data`` (a ``torch.export.save`` file): bytes flipped in a
    JSON member, a member dropped or duplicated, a JSON field given another type or nested
    thousands deep, an expression string (symbolic size, range constraint, guard) replaced
    with random Python that would write a marker file, a name or constant input that would
    escape its quotes in the Python ``ep.module()`` generates, a pickle that would write the
    marker, a native library under ``data/aotinductor/``, or the file truncated. One to three
    of these.

``check_mutant(path: str | os.PathLike) -> str | None``
    Load the file at ``path`` with ``fxpass.targets.pt2.load`` (and, when it loads, build and
    call ``ep.module()`` on its example inputs) and return what went wrong, or ``None``: it
    must load or raise one ``Pt2Error`` line, never another exception, and the marker file
    (:data:`MARKER`) must never appear.

``seed_pt2() -> bytes``
    A small program with dynamic sizes (ranges, guards, sliced sizes) and a constant string
    input (which becomes a guard) to mutate.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import random
import tempfile
import warnings
import zipfile
from pathlib import Path
from typing import Any

__all__ = ["MARKER", "check_mutant", "mutate_pt2", "seed_pt2"]

#: The file a hostile payload would create; per process, so parallel fuzzers do not collide.
MARKER = Path(tempfile.gettempdir()) / f"fxpass-fuzz-pt2-marker-{os.getpid()}"


# ----- payloads --------------------------------------------------------------------------------
def _touch_code() -> str:
    return f"__import__('pathlib').Path({str(MARKER)!r}).touch()"


def _python_payloads() -> list[str]:
    """Expressions that would write the marker, or reach for code, if anything evaluated them."""
    touch = _touch_code()
    return [
        touch,
        f"({touch}) or 1",
        f"Symbol('s0') + ({touch} or 1)",
        f"Integer(1) if {touch} else Integer(2)",
        f"(lambda: {touch})()",
        f"[{touch} for _ in '1']",
        "__import__('os').system('true')",
        f"eval({touch!r})",
        f"exec({touch!r})",
        "s0.__class__.__mro__[-1].__subclasses__()",
        "Symbol('s0').func.__globals__",
        "getattr(s0, 'free_symbols')",
        f"Max(s0, {touch})",
        f"L['x'].size()[0] == ({touch} or 1)",
        "L['x'].__class__",
        "open('/etc/passwd').read()",
        f"f'{{{touch}}}'",
        "s0 # comment",
        "s0;1",
        "Symbol('s0', foo=__import__('os'))",
        "Integer(2)**Integer(100000000)",
        "9" * 5000,
        "(" * 300 + "s0" + ")" * 300,
    ]


class _Touch:
    """A pickle whose loading would write the marker."""

    def __reduce__(self) -> Any:
        return (exec, (_touch_code(),))


def _pickle_payload(rng: random.Random) -> bytes:
    if rng.random() < 0.5:
        return pickle.dumps(_Touch())
    import torch

    buffer = io.BytesIO()
    torch.save({"x": _Touch()}, buffer)
    return buffer.getvalue()


# ----- the archive as members ------------------------------------------------------------------
def _members(data: bytes) -> list[tuple[zipfile.ZipInfo, bytes]]:
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        return [(info, zf.read(info)) for info in zf.infolist()]


def _pack(members: list[tuple[zipfile.ZipInfo, bytes]]) -> bytes:
    out = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # duplicate names are one of the mutations
        with zipfile.ZipFile(out, "w") as zf:
            for info, body in members:
                zf.writestr(info, body)
    return out.getvalue()


def _folder(members: list[tuple[zipfile.ZipInfo, bytes]]) -> str:
    return members[0][0].filename.split("/", 1)[0]


def _json_indices(members: list[tuple[zipfile.ZipInfo, bytes]]) -> list[int]:
    return [i for i, (info, _) in enumerate(members) if info.filename.endswith(".json")]


def _nodes(tree: Any) -> list[tuple[Any, Any]]:
    """Every (container, key) slot in a JSON tree, found without recursion."""
    slots: list[tuple[Any, Any]] = []
    stack = [tree]
    while stack:
        node = stack.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, value in list(items):
            slots.append((node, key))
            if isinstance(value, (dict, list)):
                stack.append(value)
    return slots


def _other_value(value: Any, rng: random.Random) -> Any:
    choices: list[Any] = [
        None,
        True,
        0,
        -1,
        2**70,
        1.5,
        float("inf"),
        "",
        "s0",
        "x" * 50,
        [],
        [1, "a"],
        {},
        {"as_int": "s0"},
        {"as_expr": {"expr_str": 7}},
    ]
    choices = [c for c in choices if type(c) is not type(value)] or choices
    return rng.choice(choices)


_DEEP = "fxpass-fuzz-deep-"  # a placeholder json.dumps writes, replaced by the deep text


def _deep_text(depth: int) -> str:
    """JSON nested ``depth`` deep, written as text (json.dumps would hit the recursion limit)."""
    opens = "".join('{"a": ' if i % 2 else "[" for i in range(depth))
    closes = "".join("}" if i % 2 else "]" for i in reversed(range(depth)))
    return opens + "0" + closes


def _expression_slots(tree: Any) -> list[tuple[Any, Any]]:
    """Slots holding strings torch would sympify or exec, and the range-constraint table."""
    slots = []
    for node, key in _nodes(tree):
        if key == "expr_str" or (isinstance(node, list) and node is tree.get("guards_code")):
            slots.append((node, key))
        if key == "range_constraints" and isinstance(node[key], dict):
            slots.append((node, key))
    return slots


# ----- mutations -------------------------------------------------------------------------------
def _edit_json(members: list, rng: random.Random, edit: Any) -> None:
    indices = _json_indices(members)
    if not indices:
        return
    index = rng.choice(indices)
    info, body = members[index]
    try:
        tree = json.loads(body)
    except (ValueError, RecursionError):
        return
    text = json.dumps(edit(tree, rng))
    while _DEEP in text:
        start = text.index('"' + _DEEP)
        end = text.index('"', start + 1)
        text = text[:start] + _deep_text(int(text[start + 1 + len(_DEEP) : end])) + text[end + 1 :]
    members[index] = (info, text.encode())


def _flip_json_bytes(members: list, rng: random.Random) -> None:
    indices = _json_indices(members)
    if not indices:
        return
    index = rng.choice(indices)
    info, body = members[index]
    body = bytearray(body)
    for _ in range(rng.randint(1, 8)):
        if body:
            body[rng.randrange(len(body))] = rng.randrange(256)
    members[index] = (info, bytes(body))


def _retype_field(tree: Any, rng: random.Random) -> Any:
    slots = _nodes(tree)
    if slots:
        node, key = rng.choice(slots)
        node[key] = _other_value(node[key], rng)
    return tree


def _drop_key(tree: Any, rng: random.Random) -> Any:
    slots = [(n, k) for n, k in _nodes(tree) if isinstance(n, dict)]
    if slots:
        node, key = rng.choice(slots)
        del node[key]
    return tree


def _deepen(tree: Any, rng: random.Random) -> Any:
    slots = _nodes(tree)
    depth = rng.choice([50, 500, 990, 3000, 10_000])
    if not slots:
        return f"{_DEEP}{depth}"
    node, key = rng.choice(slots)
    node[key] = f"{_DEEP}{depth}"
    return tree


def _hostile_expression(tree: Any, rng: random.Random) -> Any:
    slots = _expression_slots(tree) if isinstance(tree, dict) else []
    if not slots:
        return tree
    node, key = rng.choice(slots)
    payload = rng.choice(_python_payloads())
    if key == "range_constraints":
        node[key][payload] = {"min_val": rng.choice([0, 2, payload]), "max_val": None}
    else:
        node[key] = payload
    return tree


_NAME_KEYS = ("name", "parameter_name", "buffer_name", "fqn", "target", "as_string")


def _hostile_name(tree: Any, rng: random.Random) -> Any:
    """A name or constant string torch writes into generated Python, with a quote-escape."""
    slots = [(n, k) for n, k in _nodes(tree) if k in _NAME_KEYS or k == "forward_arg_names"]
    if not slots:
        return tree
    node, key = rng.choice(slots)
    touch = _touch_code().replace("'", '"')
    payload = rng.choice(
        [
            f"a' == '' or {_touch_code()} or '",
            f'w"), {touch}, getattr(self, "w',
            f"x={_touch_code()}",
            "a\nb",
            "a\rb",
        ]
    )
    node[key] = [payload] if key == "forward_arg_names" else payload
    return tree


def _drop_member(members: list, rng: random.Random) -> None:
    if len(members) > 1:
        del members[rng.randrange(len(members))]


def _duplicate_member(members: list, rng: random.Random) -> None:
    info, body = rng.choice(members)
    if rng.random() < 0.5 and body:
        body = bytes(reversed(body))
    members.insert(rng.randrange(len(members) + 1), (info, body))


def _pickle_member(members: list, rng: random.Random) -> None:
    """A pickle that would write the marker, where torch unpickles: sample inputs, a weight
    or constant marked ``use_pickle``, an opaque or custom object constant."""
    folder = _folder(members)
    where = rng.choice(["sample", "weight", "opaque", "custom", "tensor"])
    if where == "sample":
        for i, (info, _) in enumerate(members):
            if "/data/sample_inputs/" in info.filename:
                members[i] = (info, _pickle_payload(rng))
        return
    config_dir = "weights" if where == "weight" else "constants"
    path_name = {"weight": "weight_9", "opaque": "opaque_obj_9", "custom": "custom_obj_9"}.get(
        where, "tensor_9"
    )
    for i, (info, body) in enumerate(members):
        if info.filename.endswith(f"data/{config_dir}/model_{config_dir}_config.json"):
            try:
                config = json.loads(body)
                config["config"]["hostile"] = {
                    "path_name": path_name,
                    "is_param": False,
                    "use_pickle": True,
                    "tensor_meta": None,
                }
            except (ValueError, RecursionError, TypeError, KeyError):
                continue  # an earlier mutation broke the config: the pickle goes in unnamed
            members[i] = (info, json.dumps(config).encode())
    members.append(
        (zipfile.ZipInfo(f"{folder}/data/{config_dir}/{path_name}"), _pickle_payload(rng))
    )


def _native_member(members: list, rng: random.Random) -> None:
    folder = _folder(members)
    name = rng.choice(
        ["data/aotinductor/model/model.wrapper.so", "data/aotinductor/model/x.cpp", "extra/lib.so"]
    )
    members.append((zipfile.ZipInfo(f"{folder}/{name}"), b"\x7fELF" + bytes(60)))


_MEMBER_MUTATIONS = [
    _flip_json_bytes,
    _drop_member,
    _duplicate_member,
    _pickle_member,
    _native_member,
    lambda m, r: _edit_json(m, r, _retype_field),
    lambda m, r: _edit_json(m, r, _drop_key),
    lambda m, r: _edit_json(m, r, _deepen),
    lambda m, r: _edit_json(m, r, _hostile_expression),
    lambda m, r: _edit_json(m, r, _hostile_expression),
    lambda m, r: _edit_json(m, r, _hostile_name),
]


def mutate_pt2(data: bytes, rng: random.Random) -> bytes:
    """One mutant of the ``.pt2`` archive ``data`` (see the module docstring)."""
    if rng.random() < 0.1:
        return data[: rng.randrange(len(data))]
    members = _members(data)
    for _ in range(rng.choice([1, 1, 2, 3])):
        rng.choice(_MEMBER_MUTATIONS)(members, rng)
    out = _pack(members) if members else b""
    if rng.random() < 0.05:
        out = out[: rng.randrange(len(out) or 1)]
    return out


# ----- the property ----------------------------------------------------------------------------
def check_mutant(path: str | os.PathLike) -> str | None:
    """What went wrong loading the mutant at ``path``, or ``None`` (see the module docstring)."""
    import torch

    from fxpass.targets.pt2 import Pt2Error, load

    MARKER.unlink(missing_ok=True)
    problem = None
    try:
        ep = load(path)
    except Pt2Error as e:
        text = str(e)
        if "\n" in text or len(text) > 2000:
            problem = f"Pt2Error is not one short line ({len(text)} characters)"
    except BaseException as e:  # the property: nothing but Pt2Error escapes
        problem = f"load raised {type(e).__name__}: {str(e)[:300]}"
    else:
        example = ep.example_inputs or ((), {})
        try:
            with torch.no_grad():
                ep.module()(*example[0], **example[1])
        except Exception:  # a mutated program may fail to run; it must only not run code
            pass
    if MARKER.exists():
        MARKER.unlink()
        problem = f"a payload ran: {MARKER} was written" + (f" ({problem})" if problem else "")
    return problem


def seed_pt2() -> bytes:
    """A small exported program with symbolic sizes, ranges, guards and a constant string input."""
    import torch
    from torch.export import Dim

    class Seed(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)
            self.register_buffer("scale", torch.linspace(1, 2, 4))

        def forward(self, x, y, mode: str):
            n = x.shape[0]
            z = self.lin(x) * self.scale
            z = z * 2 if mode == "double" else z
            return z.sum() + y[: n // 2 + 1].sum(), torch.cat([x[:, 0], y[:, 0]])

    torch.manual_seed(0)
    ep = torch.export.export(
        Seed(),
        (torch.randn(6, 4), torch.randn(13, 4), "double"),
        dynamic_shapes={"x": {0: Dim.AUTO}, "y": {0: Dim.AUTO}, "mode": None},
    )
    buffer = io.BytesIO()
    torch.export.save(ep, buffer)
    return buffer.getvalue()


if __name__ == "__main__":  # a quick standalone run: python tools/fuzz_pt2.py [N [FOLDER [SEED]]]
    import sys

    n = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    keep = Path(sys.argv[2] if len(sys.argv) > 2 else "fuzz-pt2-failures")
    seed, rng, bad = seed_pt2(), random.Random(int(sys.argv[3]) if len(sys.argv) > 3 else 0), 0
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(n):
            mutant = Path(tmp) / f"mutant{i}.pt2"
            mutant.write_bytes(mutate_pt2(seed, rng))
            found = check_mutant(mutant)
            if found:
                bad += 1
                keep.mkdir(parents=True, exist_ok=True)
                (keep / mutant.name).write_bytes(mutant.read_bytes())
                print(f"{keep / mutant.name}: {found}")
    print(f"{n} mutants, {bad} problems")
